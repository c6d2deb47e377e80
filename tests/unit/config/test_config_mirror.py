"""The ``[mirror]`` table and ``[daemon] stagger_s``: defaults, ranges, and a password never in the text."""

from __future__ import annotations

import pytest

from gpushift.config.schema import parse
from gpushift.errors import ConfigError

BACKEND = '[backends.x]\nunit = "x.service"\nhealth_url = "http://127.0.0.1:8001/health"\n'


def mirror(lines: str) -> str:
    return f"[mirror]\n{lines}\n{BACKEND}"


def test_no_mirror_by_default_and_no_stagger() -> None:
    cfg = parse(BACKEND, "/t.toml")
    assert not cfg.mirror.enabled and cfg.mirror.url == ""
    assert cfg.mirror.host_name is None and cfg.mirror.password_file is None
    assert (cfg.mirror.stale_after_s, cfg.mirror.connect_timeout_s, cfg.mirror.batch_size) == (120.0, 5, 100)
    assert cfg.daemon.stagger_s == 0


def test_a_mirror_with_its_password_from_a_file_or_a_credential() -> None:
    cfg = parse(
        mirror(
            'url = "postgresql://gpushift@db.lan:5433/fleet?sslmode=require"\n'
            'password_file = "/etc/gpushift/mirror.password"\nhost_name = "gpu-3"'
        ),  # fmt: skip
        "/t.toml",
    )
    m = cfg.mirror
    assert m.enabled and m.url.endswith("/fleet?sslmode=require")
    assert (m.password_file, m.host_name) == ("/etc/gpushift/mirror.password", "gpu-3")
    cred = parse(mirror('url = "postgres://u@h/db"\npassword_credential = "mirror.password"'), "/t.toml")
    assert cred.mirror.password_credential == "mirror.password"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://gpushift:hunter2-secret@db.lan:5432/fleet",
        "postgresql://gpushift:@db.lan/fleet",
        "postgresql://gpushift@db.lan/fleet?password=hunter2-secret",
        "postgresql://gpushift@db.lan/fleet?sslmode=require&passfile=/root/hunter2-secret",
    ],
)
def test_a_password_in_the_url_is_refused_and_never_shown(url: str) -> None:
    with pytest.raises(ConfigError, match=r"/t\.toml:2: mirror\.url: .*password") as e:
        parse(mirror(f'url = "{url}"'), "/t.toml")
    assert "hunter2" not in str(e.value) and "db.lan" not in str(e.value)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://u@h/db", "postgresql://"),
        ("postgresql://h/db", "user name"),
        ("postgresql://u@/db", "host"),
        ("postgresql://u@h:99999/db", "valid host and port"),
        ("postgresql://u@h", "database name"),
        ("postgresql://u@h/db?application_name=x", "unknown URL parameter 'application_name'"),
    ],
)
def test_a_bad_url_is_refused_naming_the_problem(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"mirror\.url: .*{why}"):
        parse(mirror(f'url = "{url}"'), "/t.toml")


@pytest.mark.parametrize(
    ("lines", "key"),
    [
        ('password_file = "relative/path"', "mirror.password_file"),
        ('password_credential = "a/b"', "mirror.password_credential"),
        ('password_file = "/p"\npassword_credential = "c"', "mirror.password_credential"),
        ('host_name = "two words"', "mirror.host_name"),
        ('host_name = "-dash"', "mirror.host_name"),
        ("secret = 1", "mirror.secret"),
    ],
)
def test_bad_keys_are_named(lines: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: "):
        parse(mirror(lines), "/t.toml")


def test_stagger_is_whole_seconds() -> None:
    assert parse(f"[daemon]\nstagger_s = 600\n{BACKEND}", "/t.toml").daemon.stagger_s == 600
    with pytest.raises(ConfigError, match=r"daemon\.stagger_s: expected an integer"):
        parse(f"[daemon]\nstagger_s = 1.5\n{BACKEND}", "/t.toml")
