"""The package's life cycle in a throwaway Debian 12: install, upgrade, remove, purge.

What is real and what is recorded:

* Real: a ``debootstrap --variant=minbase bookworm`` root (cached, under an overlay of this test's:
  ``tests/support/debroot.py``), chrooted into inside a private mount namespace; Debian's own
  ``apt-get`` and ``dpkg`` installing the ``make deb`` packages (``debpkg.py``) with their
  dependencies from the Debian mirror (archives cached per machine), the maintainer scripts, dpkg's
  conffile handling, ``systemd-sysusers``, ``systemd-tmpfiles``, ``deb-systemd-helper``, and
  ``systemctl`` acting on unit files (``is-enabled``, ``enable``: offline, as in any chroot).
* Recorded, not run: what would ask a running systemd (``daemon-reload``, ``try-restart``, ``stop``)
  and every ``policy-rc.d`` question (answered 101, "do not start").  The root is made to look
  booted (``/run/systemd/system``), so the maintainer scripts take their booted-host paths.  Each
  record names the package whose script asked (``$DPKG_MAINTSCRIPT_PACKAGE``).

The versions: ``make deb`` (``X-1``) and ``make deb DEB_VERSION=X-2`` from the same tree, the
upgrade from the first to the second (an edited conffile the package did not change: kept, no
question); then ``X-3``, ``packaging/deb.sh`` on a copy of the tree whose two shipped conffiles
changed (the edited one kept with the new one beside it as ``.dpkg-dist``, the unedited one
replaced).  The package's policy (docs/install.md, "What the package
starts"): install enables and starts nothing; an upgrade restarts gpushift's own services that run
(``try-restart``); removal stops them; nothing ever names a backend.
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from debpkg import build, deb_sh, debian_version, own_units, tree_copy

from tests.support.debroot import Call, DebRootError, ThrowawayRoot, missing_tools

#: gpushift's vendor files: present while the package is installed, gone after remove and purge.
VENDOR = (
    "/opt/gpushift/bin/gpushift",
    "/opt/gpushift/pyvenv.cfg",
    "/usr/bin/gpushift",
    "/usr/lib/systemd/system/gpushift.service",
    "/usr/lib/sysusers.d/gpushift.conf",
    "/usr/lib/tmpfiles.d/gpushift.conf",
    "/usr/share/dbus-1/system.d/org.gpushift.Switcher1.conf",
    "/usr/share/man/man1/gpushift.1.gz",
    "/usr/share/bash-completion/completions/gpushift",
    "/usr/share/doc/gpushift/examples/gpushift-vllm.service",
    "/usr/share/doc/gpushift/examples/gpushift-llama.service",
)
CONFFILES = ("/etc/gpushift/gpushift.toml", "/etc/gpushift/schedule")
LEDGER = "/var/lib/gpushift/ledger.db"
#: Never there: a backend in systemd's path, the checkout install's places, its manifest.
NEVER = (
    "/etc/systemd/system/gpushift-vllm.service",
    "/etc/systemd/system/gpushift-llama.service",
    "/usr/lib/systemd/system/gpushift-vllm.service",
    "/usr/local/bin/gpushift",
    "/opt/gpushift/share/gpushift/manifest",
)
WANTS = "/etc/systemd/system/multi-user.target.wants/gpushift.service"
#: deb-systemd-invoke asks policy-rc.d unit by unit and stops at the first "no" (101): the record has
#: the first of gpushift's own services (try-restart) or units (stop) the scripts name.
FIRST_SERVICE, FIRST_UNIT = own_units()[0][0], own_units()[1][0]


@pytest.fixture(scope="module")
def debs() -> tuple[Path, Path]:
    return build(), build(debian_version(2))


#: The first line both shipped conffiles get in the third version.
SHIPPED_CHANGE = "# changed by the package's next version\n"


def changed_conffiles_deb(into: Path) -> Path:
    """Version 3: the same tree but for both shipped conffiles, which gain a first line."""
    src = tree_copy(into / "v3")
    for name in ("gpushift.toml", "schedule"):
        f = src / "etc/gpushift" / name
        f.write_text(SHIPPED_CHANGE + f.read_text())
    r = deb_sh(src, debian_version(3), into)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return next(into.glob(f"gpushift_{debian_version(3)}_*.deb"))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[ThrowawayRoot]:
    missing = missing_tools()
    if missing:
        pytest.fail(
            f"missing: {', '.join(missing)} (Debian: apt-get install debootstrap util-linux)", pytrace=False
        )
    try:
        r = ThrowawayRoot(tmp_path / "root").start()
    except DebRootError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        r.install_recorders()
        yield r
    finally:
        r.stop()


def present(root: ThrowawayRoot, paths: tuple[str, ...]) -> list[str]:
    return [
        p for p in paths if (root.path / p.lstrip("/")).exists() or (root.path / p.lstrip("/")).is_symlink()
    ]


def absent(root: ThrowawayRoot, paths: tuple[str, ...]) -> list[str]:
    return [p for p in paths if p not in present(root, paths)]


def apt(root: ThrowawayRoot, words: str) -> str:
    r = root.run(f"apt-get -y -q -o Dpkg::Use-Pty=0 {words}", timeout_s=900)
    assert r.returncode == 0, f"apt-get {words}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout + r.stderr


def gpushift_calls(root: ThrowawayRoot) -> list[tuple[str, ...]]:
    """What gpushift's maintainer scripts asked systemd and policy-rc.d, since the last clear."""
    calls: list[Call] = root.record("gpushift")
    for c in calls:
        assert not any("vllm" in w or "llama" in w for w in c.argv), f"a backend was named: {c}"
    return [(c.tool, *c.argv) for c in calls]


def is_enabled(root: ThrowawayRoot) -> str:
    return root.run("systemctl is-enabled gpushift.service || true").stdout.strip()


# Its own deadline, not the suite's 300 s: the item's time includes two `make deb`s (setup), a
# third package and four apt runs that install the Depends; on this machine's 2 shared cores under
# load (and with the base root made the first time) that measured 300 s and more.
@pytest.mark.timeout(1500)
def test_install_upgrade_remove_purge(root: ThrowawayRoot, debs: tuple[Path, Path]) -> None:
    old, new = debs
    for deb in debs:
        shutil.copy2(deb, root.path / "tmp")

    # ---- install, on a minbase Debian 12 without gpushift (apt brings the Depends)
    assert not present(root, VENDOR + CONFFILES)
    out = apt(root, f"install ./tmp/{old.name}")
    assert f"Setting up gpushift ({debian_version()})" in out
    assert present(root, VENDOR + CONFFILES) == list(VENDOR + CONFFILES)
    assert not present(root, NEVER + (WANTS, LEDGER))
    assert root.must("getent group gpushift").startswith("gpushift:x:")
    for d in ("/var/lib/gpushift", "/run/gpushift"):
        st = (root.path / d.lstrip("/")).stat()
        assert stat.S_IMODE(st.st_mode) == 0o750, d
    assert root.must("stat -c '%U:%G' /var/lib/gpushift").strip() == "root:gpushift"
    # the policy: nothing enabled, nothing started or asked to start; systemd told to re-read
    assert is_enabled(root) == "disabled"
    assert gpushift_calls(root) == [("systemctl", "--system", "daemon-reload")]
    # the installed command runs from its venv and reads the shipped config
    assert root.must("gpushift --version").startswith(f"gpushift {debian_version().split('-')[0]}")
    assert "OK" in root.must("gpushift --config /etc/gpushift/gpushift.toml schedule check").upper()
    rc = root.run("gpushift check --json >/dev/null").returncode
    assert rc in (0, 1), f"gpushift check says the shipped config is invalid (exit {rc})"

    # ---- the admin edits the config and enables the daemon; the daemon wrote a ledger
    toml = root.path / "etc/gpushift/gpushift.toml"
    edited = toml.read_text().replace('on_failure = "rollback"', 'on_failure = "stay"')
    assert edited != toml.read_text()
    toml.write_text(edited)
    (root.path / LEDGER.lstrip("/")).write_bytes(b"SQLite format 3\0the ledger")
    root.must("systemctl enable gpushift.service")
    root.clear_record()

    # ---- upgrade to the bumped version from the same tree
    out = apt(root, f"install ./tmp/{new.name}")
    assert f"Unpacking gpushift ({debian_version(2)}) over ({debian_version()})" in out
    assert root.must("dpkg-query -W -f '${Version}' gpushift") == debian_version(2)
    assert toml.read_text() == edited  # an edited conffile the package did not change: kept, no prompt
    assert not list((root.path / "etc/gpushift").glob("*.dpkg-*"))
    assert (root.path / LEDGER.lstrip("/")).read_bytes() == b"SQLite format 3\0the ledger"
    assert present(root, VENDOR) == list(VENDOR)
    assert is_enabled(root) == "enabled"  # the admin's choice stays
    assert gpushift_calls(root) == [
        ("systemctl", "--system", "daemon-reload"),
        ("policy-rc.d", FIRST_SERVICE, "try-restart"),  # restart what runs (101 here: not run)
    ]
    root.clear_record()

    # ---- an upgrade whose package changed both conffiles: the edited one is kept (the new one goes
    # beside it as .dpkg-dist: --force-confold, which apt-get's caller, e.g. Ansible, passes), the
    # unedited one is replaced, and nothing asks (the prompt needs --force-conf*: no terminal here)
    third = changed_conffiles_deb(root.path / "tmp")
    out = apt(
        root,
        f"-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install ./tmp/{third.name}",
    )
    assert root.must("dpkg-query -W -f '${Version}' gpushift") == debian_version(3)
    assert toml.read_text() == edited
    dist = root.path / "etc/gpushift/gpushift.toml.dpkg-dist"
    assert dist.read_text().startswith(SHIPPED_CHANGE), dist
    assert (root.path / "etc/gpushift/schedule").read_text().startswith(SHIPPED_CHANGE)
    assert not (root.path / "etc/gpushift/schedule.dpkg-dist").exists()
    assert [c for c in gpushift_calls(root) if c[0] == "policy-rc.d"] == [
        ("policy-rc.d", FIRST_SERVICE, "try-restart")
    ]
    root.clear_record()

    # ---- remove: the vendor files go; the edited config, the ledger and the group stay
    apt(root, "remove gpushift")
    assert not present(root, VENDOR)
    assert present(root, CONFFILES + (LEDGER,)) == list(CONFFILES + (LEDGER,))
    assert toml.read_text() == edited
    assert root.must("dpkg-query -W -f '${db:Status-Abbrev}' gpushift").strip() == "rc"
    assert gpushift_calls(root) == [
        ("policy-rc.d", FIRST_UNIT, "stop"),
        ("systemctl", "--system", "daemon-reload"),
    ]
    root.clear_record()

    # ---- purge: the config, the ledger, the spool and the admin's enable link go; the group stays
    apt(root, "purge gpushift")
    assert absent(root, CONFFILES + (LEDGER, WANTS)) == list(CONFFILES + (LEDGER, WANTS))
    assert not dist.exists()
    assert not present(root, ("/etc/gpushift", "/var/lib/gpushift", "/run/gpushift", "/opt/gpushift"))
    assert root.must("getent group gpushift").startswith("gpushift:x:")
    assert root.run("dpkg -s gpushift").returncode != 0  # dpkg knows nothing of it any more
    assert gpushift_calls(root) == [
        ("systemctl", "daemon-reload"),  # deb-systemd-helper's, after removing the enable link
        ("systemctl", "--system", "daemon-reload"),
    ]
    assert not present(root, ("/var/lib/systemd/deb-systemd-helper-enabled/gpushift.service.dsh-also",))
