"""``make install`` / ``make uninstall``: gpushift installed the way a distribution installs a daemon.

What runs, and what is staged:

* ``make install DESTDIR=<tmp> PREFIX=/opt/gpushift`` for real, offline from the wheelhouse the
  packaging test also uses (``wheelhouse.py``); the build (wheel, man page, completions) goes to a
  temporary ``BUILDDIR`` shared by this module, so the checkout is not written to.
* "The staged tree runs once moved to /": in a private mount namespace (``unshare -m``) the staged
  ``opt/gpushift`` is bind-mounted onto ``/opt/gpushift``, the staged ``etc/gpushift`` onto
  ``/etc/gpushift`` (over a throwaway overlay of ``/etc``) and an empty tmpfs over the checkout; the
  staged ``usr/local/bin/gpushift`` link is what runs.
* ``systemd-analyze verify`` (systemd 252) on the installed units: ``--root=`` a copy of the
  staged tree (hard links) plus this machine's system units (``multi-user.target``...); the
  backends' own programs (vLLM's python, ``llama-server``: the admin's, not installed by us) are
  placeholders there, gpushift's command is the installed one.
* The live system (no DESTDIR, so sysusers, tmpfiles and the messages run): ``make install`` onto
  ``/`` inside a private mount namespace whose ``/etc``, ``/usr`` and ``/var`` are overlays with
  throwaway upper layers and whose ``/opt`` and ``/run`` are empty tmpfs; what install and uninstall
  changed on this machine is read from the upper layers.  systemd does not run as PID 1 here, so
  ``systemctl daemon-reload`` is (and must say it is) skipped.

These tests run as root (unshare, mount, make install); they fail when root, unshare, groff or
systemd-analyze is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from wheelhouse import gather, offline

REPO = Path(__file__).resolve().parents[2]
PREFIX = "/opt/gpushift"
#: What the Makefile makes the venv from (INSTALL_PYTHON): the system Python.
INSTALL_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else shutil.which("python3") or ""


def _unitdir() -> str:
    """Where gpushift.service belongs: systemd.pc's systemdsystemunitdir, in its /usr form where /lib
    links to usr/lib (Debian 12's systemd.pc says /lib/systemd/system)."""
    r = subprocess.run(
        ["pkg-config", "--variable=systemdsystemunitdir", "systemd"], capture_output=True, text=True
    )
    unitdir = r.stdout.strip() or "/usr/lib/systemd/system"
    if unitdir.startswith("/lib/") and os.path.realpath("/lib") == "/usr/lib":
        unitdir = "/usr" + unitdir
    return unitdir


UNITDIR = _unitdir()
#: Every path make install lays out outside the venv, with its mode ("link" for a symlink).
LAYOUT = {
    "/usr/local/bin/gpushift": "link",
    f"{UNITDIR}/gpushift.service": 0o644,
    f"{UNITDIR}/gpushift-frontdoor.service": 0o644,
    f"{UNITDIR}/gpushift-frontdoor.socket": 0o644,
    "/usr/share/dbus-1/system.d/org.gpushift.Switcher1.conf": 0o644,
    "/usr/share/dbus-1/system.d/org.gpushift.FrontDoor1.conf": 0o644,
    "/usr/lib/sysusers.d/gpushift.conf": 0o644,
    "/usr/lib/tmpfiles.d/gpushift.conf": 0o644,
    "/usr/share/bash-completion/completions/gpushift": 0o644,
    "/usr/share/zsh/vendor-completions/_gpushift": 0o644,
    "/usr/share/fish/vendor_completions.d/gpushift.fish": 0o644,
    "/usr/share/man/man1/gpushift.1": 0o644,
    "/etc/gpushift/gpushift.toml": 0o644,
    "/etc/gpushift/schedule": 0o644,
    "/etc/gpushift/llama@0.env": 0o644,  # the template unit's instances (issue 23)
    "/etc/gpushift/llama@1.env": 0o644,
    "/etc/systemd/system/gpushift-vllm.service": 0o644,
    "/etc/systemd/system/gpushift-llama.service": 0o644,
    "/etc/systemd/system/gpushift-llama@.service": 0o644,  # one llama-server per GPU (issue 23)
}
MANIFEST = f"{PREFIX}/share/gpushift/manifest"
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


def run(argv: list[str], timeout_s: float = 600, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kw)


def output(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


@pytest.fixture(scope="module", autouse=True)
def _root_and_tools() -> None:
    if os.geteuid() != 0:
        pytest.fail("test_install.py needs root (make install, unshare -m, mount)", pytrace=False)
    missing = [
        t for t in ("unshare", "mount", "make", "groff", "man", "systemd-analyze") if not shutil.which(t)
    ]
    if missing or not INSTALL_PYTHON:
        pytest.fail(
            f"missing: {', '.join(missing) or 'python3'} (Debian: apt-get install util-linux make "
            "groff-base man-db systemd python3)",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def make_vars(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The variables every make call of this module gets: the build under a temporary BUILDDIR,
    pip offline from the wheelhouse (for the system Python the venv is made from)."""
    house = gather(INSTALL_PYTHON)
    build = tmp_path_factory.mktemp("build")
    return [f"BUILDDIR={build}", f"PREFIX={PREFIX}", f"PIP_ARGS={' '.join(offline(house))}"]


def make(target: str, make_vars: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DESTDIR", "PREFIX", "MAKEFLAGS", "MFLAGS")}
    return run(["make", "--no-print-directory", "-C", str(REPO), target, *make_vars, *extra], env=env)


def install(dest: Path, make_vars: list[str]) -> str:
    r = make("install", make_vars, f"DESTDIR={dest}")
    assert r.returncode == 0, f"make install DESTDIR={dest} failed:\n{output(r)}"
    return r.stdout


def tree(root: Path) -> set[str]:
    """Every path under root (files, links, directories), as absolute paths of the target host."""
    return {"/" + str(p.relative_to(root)) for p in root.rglob("*")}


def files(root: Path) -> set[str]:
    """The paths under root that are not directories (files, links)."""
    return {
        p for p in tree(root) if (root / p.lstrip("/")).is_symlink() or not (root / p.lstrip("/")).is_dir()
    }


def files_outside_venv(root: Path) -> set[str]:
    return {p for p in files(root) if not p.startswith(PREFIX + "/")}


def sections(text: str) -> dict[str, str]:
    """``== name`` lines split a script's output into named parts."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("== "):
            current = found.setdefault(line[3:].strip(), [])
        else:
            current.append(line)
    return {k: "\n".join(v) for k, v in found.items()}


def in_namespace(script: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a bash script in a private mount namespace: its mounts vanish with it."""
    return run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-euo", "pipefail", "-c", script],
        timeout_s,
        env={**CLEAN_ENV, "PYTHONDONTWRITEBYTECODE": "1"},
    )


@dataclass(frozen=True)
class Staged:
    dest: Path
    stdout: str


@pytest.fixture(scope="module")
def staged(make_vars: list[str], tmp_path_factory: pytest.TempPathFactory) -> Staged:
    """One ``make install DESTDIR=...`` that the read-only tests below share."""
    dest = tmp_path_factory.mktemp("staged") / "root"
    return Staged(dest, install(dest, make_vars))


# ------------------------------------------------------------------ the staged tree


def test_install_lays_out_every_file_with_its_mode(staged: Staged) -> None:
    d = staged.dest
    assert files_outside_venv(d) == set(LAYOUT), staged.stdout
    for path, mode in LAYOUT.items():
        p = d / path.lstrip("/")
        if mode == "link":
            assert p.is_symlink() and os.readlink(p) == f"{PREFIX}/bin/gpushift", path
        else:
            st = p.lstat()
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))
    for p in d.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            assert stat.S_IMODE(p.stat().st_mode) == 0o755, (p, oct(p.stat().st_mode))

    venv = d / PREFIX.lstrip("/")
    assert (venv / "bin/gpushift").stat().st_mode & 0o755 == 0o755
    # made from the system Python (not a pyenv under /root, which the group could not read)
    assert f"home = {Path(INSTALL_PYTHON).parent}\n" in (venv / "pyvenv.cfg").read_text()
    # group gpushift's members run the CLI: every file of the venv readable by all, dirs searchable
    for p in venv.rglob("*"):
        if p.is_symlink():
            continue
        need = 0o005 if p.is_dir() else 0o004
        assert p.stat().st_mode & need == need, (p, oct(p.stat().st_mode))
    # nothing in the tree names the staging directory (shebangs, pyvenv.cfg, .pyc paths...)
    r = run(["grep", "-rlF", str(d), str(d)])
    assert r.returncode == 1 and not r.stdout, f"files naming DESTDIR:\n{r.stdout}"
    assert f"command = {INSTALL_PYTHON} -m venv --without-pip {PREFIX}" in (venv / "pyvenv.cfg").read_text()
    assert (venv / "bin/gpushift").read_text().startswith(f"#!{PREFIX}/bin/python\n")

    unit = (d / UNITDIR.lstrip("/") / "gpushift.service").read_text()
    assert f"\nExecStart={PREFIX}/bin/gpushift daemon\n" in unit
    assert f"\nExecReload={PREFIX}/bin/gpushift reload\n" in unit
    own = ("gpushift.service", "gpushift-frontdoor.service", "gpushift-frontdoor.socket")
    for name in ("gpushift-vllm.service", "gpushift-llama.service", *own):
        installed = d / ("etc/systemd/system" if name not in own else UNITDIR.lstrip("/")) / name
        shipped = (REPO / "units" / name).read_text()
        assert installed.read_text() == shipped.replace(
            "/opt/gpushift/bin/gpushift", f"{PREFIX}/bin/gpushift"
        )
    for name in own:  # never in the admin's directory
        assert not (d / "etc/systemd/system" / name).exists(), name
    front = (d / UNITDIR.lstrip("/") / "gpushift-frontdoor.service").read_text()
    assert (
        f"\nExecStart={PREFIX}/bin/gpushift frontdoor\n" in front and "\nUser=gpushift-frontdoor\n" in front
    )
    # systemd gives StateDirectory=/RuntimeDirectory= to User=:Group= at each start: with
    # Group=gpushift they stay root:gpushift 0750, as tmpfiles.d makes them, and the group reads the ledger
    assert "\nGroup=gpushift\n" in unit and "\nStateDirectoryMode=0750\n" in unit

    sysusers = (d / "usr/lib/sysusers.d/gpushift.conf").read_text()
    assert sysusers.count("\ng gpushift ") == 1 and sysusers.count("\nu gpushift-frontdoor ") == 1
    tmpfiles = (d / "usr/lib/tmpfiles.d/gpushift.conf").read_text()
    assert "\nd /var/lib/gpushift 0750 root gpushift -\n" in tmpfiles
    assert "\nd /run/gpushift 0750 root gpushift -\n" in tmpfiles
    assert "DESTDIR is set: systemd-sysusers, systemd-tmpfiles --create and systemctl daemon-reload were" in (
        staged.stdout
    )
    manifest = (d / MANIFEST.lstrip("/")).read_text().splitlines()
    listed = {line.split("\t")[2] for line in manifest}
    assert set(LAYOUT) | {PREFIX} <= listed, manifest


def test_installed_gpushift_runs_from_its_venv_without_the_checkout(staged: Staged, tmp_path: Path) -> None:
    d = staged.dest
    upper = tmp_path / "ns"
    script = f"""
        mount -t tmpfs tmpfs /opt && mkdir /opt/gpushift && mount --bind {d}/opt/gpushift /opt/gpushift
        mkdir -p {upper} && mount -t tmpfs tmpfs {upper} && mkdir {upper}/u {upper}/w
        mount -t overlay overlay -o lowerdir=/etc,upperdir={upper}/u,workdir={upper}/w /etc
        mkdir /etc/gpushift && mount --bind {d}/etc/gpushift /etc/gpushift
        mount -t tmpfs tmpfs {REPO}
        cd /
        test -z "$(ls -A {REPO})"
        gs={d}/usr/local/bin/gpushift
        echo "== version"; $gs --version
        echo "== help"; $gs --help
        echo "== check"; $gs check --json > {tmp_path}/check.json || echo "check exit $?"
        echo "== origin"; /opt/gpushift/bin/python -c 'import gpushift, sys; print(gpushift.__file__); print(sys.path)'
        echo "== complete"
        set +eu  # the completion script is written for an interactive shell
        source {d}/usr/share/bash-completion/completions/gpushift
        PATH={d}/usr/local/bin:$PATH
        COMP_WORDS=(gpushift ledger ""); COMP_CWORD=2; _gpushift_completion gpushift; echo "${{COMPREPLY[@]}}"
        echo "== json"; cat {tmp_path}/check.json
    """
    r = in_namespace(script)
    assert r.returncode == 0, output(r)
    part = sections(r.stdout)
    from gpushift import __version__

    version_lines = part["version"].strip().splitlines()
    assert version_lines[0] == f"gpushift {__version__}", output(r)
    assert any(line.startswith("jeepney ") for line in version_lines), output(r)  # from the venv's metadata
    assert version_lines[-1].startswith("NVIDIA driver "), output(r)
    for command in ("status", "switch", "daemon", "ledger", "schedule", "check", "frontdoor"):
        assert f"\n  {command} " in part["help"], part["help"]
    assert part["origin"].startswith(f"{PREFIX}/lib/python3"), part["origin"]
    # pip's record of where the wheel came from names the build machine's directories: not installed
    assert not list(
        (d / PREFIX.lstrip("/")).glob("lib/python*/site-packages/gpushift-*.dist-info/direct_url.json")
    )
    assert str(REPO) not in part["origin"]
    assert part["complete"].split() == ["diff", "export", "show", "verify"], output(r)
    # no systemd bus and no NVML in here: check reports them, but reads the installed config and
    # schedule from their default paths
    assert part["check"].strip() in ("", "check exit 1"), output(r)
    report = json.loads(part["json"])
    assert report["config"]["path"] == "/etc/gpushift/gpushift.toml" and report["config"]["ok"] is True, (
        report
    )
    assert report["schedule"]["ok"] is True, report["schedule"]


def _verify_root(staged: Staged, root: Path, with_venv: bool) -> subprocess.CompletedProcess[str]:
    seen = set()
    for system in ("/usr/lib/systemd/system", "/lib/systemd/system"):  # multi-user.target, dbus.service...
        if Path(system).is_dir() and Path(system).resolve() not in seen:
            seen.add(Path(system).resolve())
            shutil.copytree(system, root / system.lstrip("/"), symlinks=True, dirs_exist_ok=True)
    run(["cp", "-al", f"{staged.dest}/.", str(root)]).check_returncode()
    if not with_venv:
        shutil.rmtree(root / PREFIX.lstrip("/"))
    for program in ("opt/vllm/bin/python", "usr/local/bin/llama-server"):  # the admin's programs
        exe = root / program
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    units = [
        "gpushift.service",
        "gpushift-frontdoor.service",
        "gpushift-frontdoor.socket",
        "gpushift-vllm.service",
        "gpushift-llama.service",
    ]
    return run(["systemd-analyze", "verify", "--man=no", "--generators=no", f"--root={root}", *units], 120)


def test_installed_units_pass_systemd_analyze_verify(staged: Staged, tmp_path: Path) -> None:
    r = _verify_root(staged, tmp_path / "root", with_venv=True)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), output(r)
    # ... and verify did look at the installed command: without the venv it is missing
    r = _verify_root(staged, tmp_path / "bare", with_venv=False)
    assert r.returncode != 0, output(r)
    assert f"Command {PREFIX}/bin/gpushift is not executable" in r.stdout + r.stderr, output(r)


# ------------------------------------------------------------------ the man page and the completions


def click_tree() -> dict[str, click.Command]:
    """Every command path of the CLI, walked here through click's own API (lazy groups included)."""
    from gpushift.cli import main

    found: dict[str, click.Command] = {}

    def visit(cmd: click.Command, ctx: click.Context) -> None:
        found[ctx.command_path] = cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, f"{ctx.command_path} lists {name} but cannot load it"
                visit(sub, click.Context(sub, info_name=name, parent=ctx))

    visit(main, click.Context(main, info_name="gpushift"))
    return found


def test_man_page_lists_every_command_and_option(staged: Staged) -> None:
    page = staged.dest / "usr/share/man/man1/gpushift.1"
    r = run(["groff", "-man", "-Tutf8", "-ww", "-z", str(page)])
    assert r.returncode == 0 and not r.stderr, f"groff warns about gpushift.1:\n{r.stderr}"
    r = run(["man", "-l", str(page)], env={**CLEAN_ENV, "MANWIDTH": "300"})
    assert r.returncode == 0, output(r)
    text = r.stdout
    tree = click_tree()
    lazy = {
        "gpushift ledger",
        "gpushift ledger show",
        "gpushift schedule",
        "gpushift schedule check",
        "gpushift check",
    }
    assert lazy <= set(tree), sorted(tree)
    headings = {ln.strip() for ln in text.splitlines() if ln.startswith("   gpushift")}
    assert headings == set(tree) - {"gpushift"}, sorted(headings ^ (set(tree) - {"gpushift"}))
    for path, cmd in tree.items():
        section = (
            text if path == "gpushift" else text.split(f"\n   {path}\n", 1)[1].split("\n   gpushift", 1)[0]
        )
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in param.opts:
                    assert re.search(rf"(^|[\s,]){re.escape(opt)}\b", section), f"{path}: {opt} missing"
    assert "EXIT STATUS" in text and "\n       8      VRAM held" in text


def test_completions_are_generated_by_click_for_each_shell(staged: Staged) -> None:
    share = staged.dest / "usr/share"
    bash = (share / "bash-completion/completions/gpushift").read_text()
    zsh = (share / "zsh/vendor-completions/_gpushift").read_text()
    fish = (share / "fish/vendor_completions.d/gpushift.fish").read_text()
    assert (
        "_GPUSHIFT_COMPLETE=bash_complete" in bash
        and "complete -o nosort -F _gpushift_completion gpushift" in bash
    )
    assert zsh.startswith("#compdef gpushift\n") and "_GPUSHIFT_COMPLETE=zsh_complete" in zsh
    assert "_GPUSHIFT_COMPLETE=fish_complete" in fish and "complete --no-files --command gpushift" in fish
    r = run(["bash", "-n", str(share / "bash-completion/completions/gpushift")])
    assert r.returncode == 0, output(r)


# ------------------------------------------------------------------ upgrades and uninstall (DESTDIR)


def _manifest_set_sha(dest: Path, path: str, content: str) -> None:
    """Pretend the previous install shipped ``content`` at ``path`` (what an upgrade finds)."""
    m = dest / MANIFEST.lstrip("/")
    digest = hashlib.sha256(content.encode()).hexdigest()
    lines = [
        f"conf\t{digest}\t{path}" if ln.endswith(f"\t{path}") else ln for ln in m.read_text().splitlines()
    ]
    m.write_text("\n".join(lines) + "\n")


def test_reinstall_keeps_edited_config_and_uninstall_keeps_ledger_and_edits(
    make_vars: list[str], tmp_path: Path
) -> None:
    d = tmp_path / "root"
    install(d, make_vars)
    toml = d / "etc/gpushift/gpushift.toml"
    schedule = d / "etc/gpushift/schedule"
    vllm = d / "etc/systemd/system/gpushift-vllm.service"
    shipped_toml = toml.read_text()
    # the admin edits the config and the vLLM unit; the daemon has written a ledger
    toml.write_text(shipped_toml.replace('on_failure = "rollback"', 'on_failure = "stay"'))
    vllm.write_text(vllm.read_text().replace("--max-model-len 8192", "--max-model-len 4096"))
    ledger = d / "var/lib/gpushift/ledger.db"
    ledger.parent.mkdir(parents=True)
    ledger.write_bytes(b"SQLite format 3\0")
    # the schedule is unedited, but the previous release shipped another one: it is updated
    old_schedule = "# an older shipped schedule\n0 8 * * * vllm\n"
    schedule.write_text(old_schedule)
    _manifest_set_sha(d, "/etc/gpushift/schedule", old_schedule)
    edited_toml = toml.read_text()

    out = install(d, make_vars)
    assert toml.read_text() == edited_toml
    assert (d / "etc/gpushift/gpushift.toml.dist").read_text() == shipped_toml
    assert (
        "/etc/gpushift/gpushift.toml KEPT: it was edited since the last install; "
        "the new version is /etc/gpushift/gpushift.toml.dist"
    ) in out
    assert "/etc/systemd/system/gpushift-vllm.service KEPT" in out
    assert (d / "etc/systemd/system/gpushift-vllm.service.dist").exists()
    assert schedule.read_text() == (REPO / "etc/gpushift/schedule").read_text()
    assert "/etc/gpushift/schedule (updated: nobody had edited it)" in out
    assert not (d / "etc/gpushift/schedule.dist").exists()
    assert "/etc/systemd/system/gpushift-llama.service (unchanged)" in out
    assert files_outside_venv(d) == set(LAYOUT) | {
        "/etc/gpushift/gpushift.toml.dist",
        "/etc/systemd/system/gpushift-vllm.service.dist",
        "/var/lib/gpushift/ledger.db",
    }
    # the admin takes the new vLLM unit as it is: the next install finds it unedited, drops the .dist
    shutil.copy(d / "etc/systemd/system/gpushift-vllm.service.dist", vllm)
    out = install(d, make_vars)
    assert "/etc/gpushift/gpushift.toml KEPT" in out  # the record is of what was shipped, not of the edit
    assert "/etc/systemd/system/gpushift-vllm.service (unchanged)" in out
    assert not (d / "etc/systemd/system/gpushift-vllm.service.dist").exists(), out

    r = make("uninstall", make_vars, f"DESTDIR={d}")
    assert r.returncode == 0, output(r)
    assert "kept /etc/gpushift/gpushift.toml: it was edited" in r.stdout
    left = {p for p in tree(d) if not (d / p.lstrip("/")).is_dir()}
    assert left == {"/var/lib/gpushift/ledger.db", "/etc/gpushift/gpushift.toml"}, r.stdout
    assert not (d / "opt").exists() and not (d / "usr").exists(), sorted(tree(d))

    r = make("uninstall", make_vars, f"DESTDIR={d}", "PURGE=1")
    assert r.returncode == 0, output(r)
    assert not d.exists() or not list(d.iterdir()), sorted(tree(d))


def test_uninstall_purge_right_after_install_leaves_nothing(make_vars: list[str], tmp_path: Path) -> None:
    d = tmp_path / "root"
    install(d, make_vars)
    (d / "run/gpushift").mkdir(parents=True)
    (d / "run/gpushift/pending-1.json").write_text("{}")
    r = make("uninstall", make_vars, f"DESTDIR={d}", "PURGE=1")
    assert r.returncode == 0, output(r)
    assert not list(d.iterdir()), sorted(tree(d))


def test_install_refuses_a_prefix_that_is_not_its_own(make_vars: list[str], tmp_path: Path) -> None:
    d = tmp_path / "root"
    (d / "opt/gpushift").mkdir(parents=True)
    (d / "opt/gpushift/data").write_text("somebody else's")
    r = make("install", make_vars, f"DESTDIR={d}")
    assert r.returncode != 0 and "is not a gpushift install" in r.stderr, output(r)
    assert (d / "opt/gpushift/data").read_text() == "somebody else's"


# ------------------------------------------------------------------ the live system (no DESTDIR)


def test_install_on_the_live_system_creates_group_and_directories_then_uninstalls(
    make_vars: list[str], tmp_path: Path
) -> None:
    layers = tmp_path / "layers"
    out = tmp_path / "out"
    out.mkdir()
    mk = " ".join(f"'{v}'" for v in make_vars)
    script = f"""
        mkdir -p {layers} && mount -t tmpfs tmpfs {layers}
        for d in etc usr var; do
            mkdir {layers}/$d {layers}/$d.work
            mount -t overlay overlay -o lowerdir=/$d,upperdir={layers}/$d,workdir={layers}/$d.work /$d
        done
        mount -t tmpfs tmpfs /opt && mount -t tmpfs tmpfs /run
        make --no-print-directory -C {REPO} install {mk} > {out}/install.txt
        getent group gpushift > {out}/group.txt
        getent passwd gpushift-frontdoor > {out}/passwd.txt
        stat -c '%n %U:%G %a' /var/lib/gpushift /run/gpushift > {out}/stat.txt
        /usr/local/bin/gpushift --version > {out}/version.txt
        echo ledger > /var/lib/gpushift/ledger.db
        make --no-print-directory -C {REPO} uninstall {mk} > {out}/uninstall.txt
        (cd {layers} && find etc usr var -not -type d | sort) > {out}/after-uninstall.txt
        test ! -e /opt/gpushift && test ! -e /usr/local/bin/gpushift
        make --no-print-directory -C {REPO} uninstall {mk} PURGE=1 > {out}/purge.txt
        (cd {layers} && find etc usr var -not -type d | sort) > {out}/after-purge.txt
        (cd {layers} && find etc usr var -type c | sort) > {out}/whiteouts.txt
        ls -A /opt > {out}/opt.txt
    """
    r = in_namespace(script)
    got = {p.name: p.read_text() for p in out.iterdir()}
    assert r.returncode == 0, output(r) + "\n" + "\n".join(f"--- {k}\n{v}" for k, v in got.items())

    installed = got["install.txt"]
    assert "systemd-sysusers: group gpushift and user gpushift-frontdoor exist" in installed, installed
    assert "systemd-tmpfiles: /var/lib/gpushift and /run/gpushift are there (0750 root:gpushift)" in installed
    assert "systemd is not running here: systemctl daemon-reload skipped" in installed
    assert "  systemctl enable --now gpushift\n  gpushift check\n" in installed
    assert got["group.txt"].startswith("gpushift:x:")
    # the front door's static user: no home, no shell, not in group gpushift
    assert re.fullmatch(
        r"gpushift-frontdoor:x:\d+:\d+:gpushift front door:/:/usr/sbin/nologin\n", got["passwd.txt"]
    )
    assert "gpushift-frontdoor" not in got["group.txt"]
    assert got["stat.txt"].splitlines() == [
        "/var/lib/gpushift root:gpushift 750",
        "/run/gpushift root:gpushift 750",
    ]
    assert got["version.txt"].startswith("gpushift ")

    # uninstall: the ledger stays, and the group and the user (and sysusers' backups): nothing else
    group_files = {"etc/group", "etc/gshadow", "etc/group-", "etc/gshadow-", "etc/.pwd.lock"}
    group_files |= {"etc/passwd", "etc/shadow", "etc/passwd-", "etc/shadow-"}
    after = set(got["after-uninstall.txt"].split())
    assert after - group_files == {"var/lib/gpushift/ledger.db"}, got["after-uninstall.txt"]
    assert "kept /var/lib/gpushift (the ledger)" in got["uninstall.txt"]
    assert "The group gpushift and the user gpushift-frontdoor stay" in got["uninstall.txt"]
    assert set(got["after-purge.txt"].split()) <= group_files, got["after-purge.txt"]
    assert not got["whiteouts.txt"].strip(), (
        f"uninstall removed files it had not installed:\n{got['whiteouts.txt']}"
    )
    assert not got["opt.txt"].strip()
