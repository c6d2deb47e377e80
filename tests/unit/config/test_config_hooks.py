"""The ``[hooks]`` and ``[notify]`` tables: an argv list or a table per event, the documented
defaults, every mistake refused with its key named, and a webhook URL never shown in an error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpushift.config.hooks import Hook, HooksConfig, NotifyConfig
from gpushift.config.schema import parse
from gpushift.errors import ConfigError
from gpushift.values import HookEvent

PATH = "/etc/gpushift/gpushift.toml"
BACKEND = """
[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
"""


def cfg(text: str):  # type: ignore[no-untyped-def]
    return parse(text + BACKEND, PATH)


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        cfg(text)
    assert exc.value.code == 2
    # the message's line number aside (tests/unit/config/test_config.py checks lines)
    return re.sub(r"^([^:]+):\d+(?::\d+)?: ", r"\1: ", str(exc.value))


def test_no_hooks_and_no_webhook_unless_configured() -> None:
    c = cfg("")
    assert c.hooks == HooksConfig() and c.hooks.user == "nobody"
    assert all(c.hooks.get(e) is None for e in HookEvent)
    assert c.notify == NotifyConfig() and not c.notify.enabled
    assert (c.notify.lead_s, c.notify.timeout_s, c.notify.max_queued) == (300.0, 10.0, 1000)


def test_each_event_takes_an_argv_list_or_a_table() -> None:
    c = cfg(
        """
[hooks]
user = "gpuhook"
before_stop = { argv = ["/usr/local/bin/may-stop", "--quiet"], required = true, timeout_s = 30 }
after_ready = ["/usr/local/bin/ready", "$HOME", "a b"]
on_failure = { argv = ["/bin/page"] }
before_boundary = { argv = ["/bin/warn"], lead_s = 600 }
"""
    )
    h = c.hooks
    assert h.user == "gpuhook"
    assert h.before_stop == Hook(HookEvent.BEFORE_STOP, ("/usr/local/bin/may-stop", "--quiet"), True, 30.0)
    # Exactly as written: no shell, no expansion.
    assert h.after_ready == Hook(HookEvent.AFTER_READY, ("/usr/local/bin/ready", "$HOME", "a b"))
    assert h.on_failure is not None and (h.on_failure.required, h.on_failure.timeout_s) == (False, 60.0)
    assert h.before_boundary is not None and h.before_boundary.lead_s == 600.0
    assert h.get(HookEvent.BEFORE_BOUNDARY) is h.before_boundary
    assert cfg('[hooks]\nbefore_boundary = ["/bin/warn"]\n').hooks.before_boundary.lead_s == 300.0  # type: ignore[union-attr]
    assert cfg('[hooks]\nuser = "0"\n').hooks.user == "0"


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("[hooks]\nbefore_stop = []\n", "hooks.before_stop", "non-empty list of strings"),
        ('[hooks]\nbefore_stop = "/bin/x"\n', "hooks.before_stop", "argv list"),
        ('[hooks]\nbefore_stop = ["x.sh"]\n', "hooks.before_stop", "absolute path"),
        ('[hooks]\nafter_ready = ["/bin/x", 3]\n', "hooks.after_ready", "list of strings"),
        (
            '[hooks]\nafter_ready = { argv = ["/bin/x"], required = true }\n',
            "hooks.after_ready.required",
            "unknown key",
        ),
        (
            '[hooks]\non_failure = { argv = ["/bin/x"], lead_s = 5 }\n',
            "hooks.on_failure.lead_s",
            "unknown key",
        ),
        ("[hooks]\non_failure = { timeout_s = 5 }\n", "hooks.on_failure.argv", "missing"),
        (
            '[hooks]\nbefore_stop = { argv = ["/bin/x"], required = "yes" }\n',
            "hooks.before_stop.required",
            "true or false",
        ),
        (
            '[hooks]\nbefore_stop = { argv = ["/bin/x"], timeout_s = 0 }\n',
            "hooks.before_stop.timeout_s",
            ">= 1",
        ),
        (
            '[hooks]\nbefore_stop = { argv = ["/bin/x"], timeout_s = 3601 }\n',
            "hooks.before_stop.timeout_s",
            "<= 3600",
        ),
        (
            '[hooks]\nbefore_boundary = { argv = ["/bin/x"], lead_s = 86401 }\n',
            "hooks.before_boundary.lead_s",
            "<= 86400",
        ),
        ('[hooks]\nuser = "Robert; rm"\n', "hooks.user", "user name"),
        ('[hooks]\nuser = ""\n', "hooks.user", "user name"),
        ('[hooks]\nafter_stop = ["/bin/x"]\n', "hooks.after_stop", "unknown key"),
        ("[notify]\nlead_s = -1\n", "notify.lead_s", ">= 0"),
        ("[notify]\ntimeout_s = 301\n", "notify.timeout_s", "<= 300"),
        ("[notify]\nmax_queued = 0\n", "notify.max_queued", ">= 1"),
        ("[notify]\nmax_queued = 100001\n", "notify.max_queued", "<= 100000"),
        ('[notify]\nwebhook = "http://x"\n', "notify.webhook", "unknown key"),
    ],
)
def test_every_mistake_is_refused_with_its_key(text: str, key: str, says: str) -> None:
    msg = refused(text)
    assert f"{key}:" in msg and says in msg, msg


SECRET_URLS = [
    "ftp://hooks.example/T0KEN-SECRET",
    "https:///T0KEN-SECRET",
    "http://chat.lan:99999/hooks/T0KEN-SECRET",
    "http://chat.lan/hooks/T0KEN-SECRET path",
    "http://user:T0KEN-SECRET@/x",
    "mattermost.lan/hooks/T0KEN-SECRET",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_bad_webhook_url_is_refused_without_showing_it(url: str) -> None:
    msg = refused(f'[notify]\nwebhook_url = "{url}"\n')
    assert "notify.webhook_url:" in msg
    assert "T0KEN" not in msg and "SECRET" not in msg, msg


def test_a_webhook_url_with_credentials_is_taken() -> None:
    n = cfg('[notify]\nwebhook_url = "https://bot:pw@chat.example:8443/hooks/abc"\nlead_s = 0\n').notify
    assert n.enabled and n.webhook_url == "https://bot:pw@chat.example:8443/hooks/abc" and n.lead_s == 0


def test_the_shipped_examples_commented_hooks_and_notify_block_parses(repo_root: Path) -> None:
    text = (repo_root / "etc" / "gpushift" / "gpushift.toml").read_text()
    start = text.index("# [hooks]")
    end = text.index("\n\n", start)
    block = re.sub(r"^# ?", "", text[start:end], flags=re.M)
    uncommented = text[:start] + block + text[end:]
    c = parse(uncommented, PATH)
    assert c.hooks.before_stop is not None and c.hooks.before_stop.required
    assert c.hooks.after_ready is not None and c.hooks.on_failure is not None
    assert c.hooks.before_boundary is not None and c.hooks.before_boundary.lead_s == 300.0
    assert c.notify.enabled and c.notify.max_queued == 1000
