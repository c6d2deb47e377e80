"""Throwaway Debian 12 roots for the package tests: a cached ``debootstrap --variant=minbase bookworm``
under an overlay, chrooted into, inside a private mount namespace.

* The base root is made once a week per machine (about 80 s, from the Debian mirror this host's apt
  uses, or ``$GPUSHIFT_DEBIAN_MIRROR``) under ``/var/cache/gpushift/debootstrap/``
  (``$GPUSHIFT_DEBOOTSTRAP_DIR``) and never written to in between: each :class:`ThrowawayRoot`
  mounts an overlay over it whose upper layer is a directory of the test's, so one test's installs
  never reach another's.
* The overlay, ``/proc``, ``/dev``, a tmpfs ``/run`` and the shared apt archive cache
  (``/var/cache/gpushift/apt-archives``: a package is downloaded once per machine) are mounted in a
  private mount namespace held by one ``sleep`` process of ours; :meth:`ThrowawayRoot.run` enters it
  (``nsenter --mount``) and ``chroot``\\s.  :attr:`ThrowawayRoot.path` is the root as seen from here
  (``/proc/PID/root/...``), for reading files.  :meth:`ThrowawayRoot.stop` ends the holder by PID,
  and the mounts vanish with the namespace.
* :meth:`ThrowawayRoot.install_recorders` makes the root look booted (``/run/systemd/system``),
  installs a ``policy-rc.d`` that records each question and answers 101 ("do not start", the
  convention for chroots), and diverts ``systemctl`` (``dpkg-divert``) to a wrapper that records each
  call, runs the real one for what acts on unit files (``enable``, ``is-enabled``, ``preset``...: it
  works offline in a chroot) and answers what would ask a running manager as a manager with
  nothing running would (``is-active``: 3; ``daemon-reload``, ``start``, ``try-restart``...: done).  Both
  record the maintainer script's package (``$DPKG_MAINTSCRIPT_PACKAGE``); :meth:`record` reads them.

A booted container (``systemd-nspawn --boot``) is not an option: this machine has no system bus.
Needs root, ``unshare``, ``nsenter``, ``debootstrap`` and the network once (to make the base root
and fill the archive cache).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .procs import end_pid, proc_starttime

SUITE = "bookworm"
CACHE = Path(os.environ.get("GPUSHIFT_DEBOOTSTRAP_DIR", "/var/cache/gpushift/debootstrap"))
ARCHIVES = Path(os.environ.get("GPUSHIFT_APT_ARCHIVES", "/var/cache/gpushift/apt-archives"))
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "DEBIAN_FRONTEND": "noninteractive",
}
RECORD = "/var/log/gpushift-test/record"
BRIDGE = "/etc/gpushift-test/manager.env"


class DebRootError(RuntimeError):
    """A throwaway root could not be made (the message says what is missing or what failed)."""


def missing_tools() -> list[str]:
    return [t for t in ("unshare", "nsenter", "chroot", "debootstrap", "mount") if not shutil.which(t)]


def _sources_uris(text: str, deb822: bool) -> list[str]:
    """The URIs of apt sources (one-line or deb822 format) that serve ``SUITE`` main."""
    found = []
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(
                (m.group(1).lower(), m.group(2).split())
                for m in re.finditer(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M)
            )
            if "deb" in fields.get("types", []) and SUITE in fields.get("suites", []):
                found += fields.get("uris", [])
    else:
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                found.append(words[1])
    return found


def mirror() -> str:
    """The Debian mirror: ``$GPUSHIFT_DEBIAN_MIRROR``, else the one this host's apt uses for the suite."""
    if os.environ.get("GPUSHIFT_DEBIAN_MIRROR"):
        return os.environ["GPUSHIFT_DEBIAN_MIRROR"]
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        if f.suffix in (".list", ".sources") or f.name == "sources.list":
            with contextlib.suppress(OSError):
                uris = _sources_uris(f.read_text(), deb822=f.suffix == ".sources")
                if uris:
                    return uris[0]
    raise DebRootError(
        f"no apt source of this host serves {SUITE} main: set GPUSHIFT_DEBIAN_MIRROR to a Debian mirror"
    )


def _arch() -> str:
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


#: A base root older than this is made again: its package lists would name versions the mirror
#: no longer has (a point release replaces them), and a package not yet in the archive cache could
#: not be downloaded.
MAX_AGE_S = float(os.environ.get("GPUSHIFT_DEBOOTSTRAP_MAX_AGE_DAYS", "7")) * 86400


def _fresh(root: Path) -> bool:
    done = root / ".complete"
    return done.exists() and time.time() - done.stat().st_mtime < MAX_AGE_S


def base_root(timeout_s: float = 1200) -> Path:
    """The cached minbase root (made under a lock from :func:`mirror` the first time, and again
    once it is older than ``MAX_AGE_S``)."""
    root = CACHE / f"{SUITE}-minbase-{_arch()}"
    if _fresh(root):
        return root
    with _locked(CACHE / ".lock"):
        if _fresh(root):
            return root
        building = CACHE / f".building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        argv = ["debootstrap", "--variant=minbase", SUITE, str(building), mirror()]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=CLEAN_ENV)
        if r.returncode != 0:
            log = (building / "debootstrap/debootstrap.log").read_text() if building.exists() else ""
            shutil.rmtree(building, ignore_errors=True)
            raise DebRootError(
                f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-3000:]}\n{log[-3000:]}"
            )
        for deb in (building / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()  # shadowed by the shared archive cache in every throwaway root
        (building / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
        # An older base may still be the lower layer of a root of a test running now: moved aside,
        # and removed at a later rebuild, a day on.
        if root.exists():
            root.rename(CACHE / f".stale-{int(time.time())}")
        for stale in CACHE.glob(".stale-*"):
            if time.time() - int(stale.name.split("-")[1]) > 86400:
                shutil.rmtree(stale, ignore_errors=True)
        building.rename(root)
    return root


@dataclass(frozen=True)
class Call:
    """One recorded call: who asked (``policy-rc.d`` or ``systemctl``), for which package, the words."""

    tool: str
    package: str
    argv: tuple[str, ...]


class ThrowawayRoot:
    """An overlay over the base root, in a private mount namespace of its own (see the module)."""

    def __init__(self, where: Path, base: Path | None = None) -> None:
        self.where = where
        self.base = base or base_root()
        self.merged = where / "root"
        self._holder: subprocess.Popen[str] | None = None
        self._starttime: int | None = None

    def start(self, timeout_s: float = 60) -> ThrowawayRoot:
        for d in ("upper", "work", "root"):
            (self.where / d).mkdir(parents=True, exist_ok=True)
        ARCHIVES.mkdir(parents=True, exist_ok=True)
        m = self.merged
        script = f"""set -e
            mount -t overlay overlay -o lowerdir={self.base},upperdir={self.where}/upper,workdir={self.where}/work {m}
            mount -t proc proc {m}/proc
            mount --rbind /dev {m}/dev
            mount -t tmpfs -o mode=0755 tmpfs {m}/run
            mount --bind {ARCHIVES} {m}/var/cache/apt/archives
            echo ready
            exec sleep infinity
        """
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=CLEAN_ENV,
        )
        assert self._holder.stdout is not None
        line = self._holder.stdout.readline()
        if line.strip() != "ready":
            err = self._holder.stderr.read() if self._holder.stderr else ""
            self.stop()
            raise DebRootError(f"could not mount the throwaway root at {m}: {line}{err}")
        self._starttime = proc_starttime(self._holder.pid)
        return self

    @property
    def pid(self) -> int:
        if self._holder is None:
            raise DebRootError("the throwaway root is not started")
        return self._holder.pid

    @property
    def path(self) -> Path:
        """The root as this process sees it (through the holder's mount namespace)."""
        return Path(f"/proc/{self.pid}/root{self.merged}")

    def enter_argv(self) -> list[str]:
        """The words that run a command inside the root: ``[*enter_argv(), "/bin/sh", "-c", ...]``."""
        return ["nsenter", f"--target={self.pid}", "--mount", "chroot", str(self.merged)]

    def run(
        self, script: str, timeout_s: float = 900, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A shell script run as root inside the root (``set -e``), its output captured."""
        return subprocess.run(
            [*self.enter_argv(), "/bin/sh", "-ec", script],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**CLEAN_ENV, **(env or {})},
        )

    def must(self, script: str, timeout_s: float = 900) -> str:
        r = self.run(script, timeout_s)
        if r.returncode != 0:
            raise DebRootError(
                f"in the throwaway root, exit {r.returncode}:\n{script}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
            )
        return r.stdout

    def install_recorders(self) -> None:
        """``policy-rc.d`` (records, answers 101) and a diverted ``systemctl`` (records, then runs the
        real one), and ``/run/systemd/system`` so that maintainer scripts act as on a booted host."""
        self.must(
            f"""
            mkdir -p /run/systemd/system {os.path.dirname(RECORD)}
            : > {RECORD}
            cat > /usr/sbin/policy-rc.d <<'EOF'
#!/bin/sh
# the test's: record the question, start nothing (101)
echo "policy-rc.d	${{DPKG_MAINTSCRIPT_PACKAGE:-}}	$*" >> {RECORD}
exit 101
EOF
            chmod 0755 /usr/sbin/policy-rc.d
            dpkg-divert --local --rename --divert /bin/systemctl.distrib --add /bin/systemctl >/dev/null
            cat > /bin/systemctl <<'EOF'
#!/bin/sh
# the test's: record the call; what acts on unit files runs the real systemctl (offline, as in
# any chroot); what would ask a running manager answers as one with nothing running would
echo "systemctl	${{DPKG_MAINTSCRIPT_PACKAGE:-}}	$*" >> {RECORD}
if [ -f {BRIDGE} ]; then bridge=1; else bridge=; fi
for word in "$@"; do
    case $word in
    -*) ;;
    is-active | is-failed | show | daemon-reload | daemon-reexec | start | stop | restart | try-restart | reload)
        if [ -n "$bridge" ]; then
            # bridged: the test's systemd user manager runs this root's gpushift (see bridge())
            set -a; . {BRIDGE}; set +a
            args=; for a in "$@"; do [ "$a" = --system ] || args="$args '$a'"; done
            eval "exec /bin/systemctl.distrib --user $args"
        fi
        case $word in is-active | is-failed) exit 3 ;; show) exit 1 ;; *) exit 0 ;; esac ;;
    *) break ;;
    esac
done
# offline: this machine hides /proc/1/root, so systemctl cannot tell it runs in a chroot
SYSTEMD_OFFLINE=1 exec /bin/systemctl.distrib "$@"
EOF
            chmod 0755 /bin/systemctl
            """
        )

    def bind(self, host_dir: Path) -> None:
        """Make a directory of this machine visible at the same path inside the root."""
        inside = f"{self.merged}{host_dir}"
        script = f"mkdir -p {inside}; mount --bind {host_dir} {inside}"
        argv = ["nsenter", f"--target={self.pid}", "--mount", "sh", "-ec", script]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise DebRootError(f"could not bind {host_dir} into the root: {r.stderr}")

    def bridge(self, runtime_dir: Path, exports: Mapping[str, str]) -> None:
        """From now on the diverted ``systemctl`` hands what would ask a running manager (``show``,
        ``start``, ``reload``, ``is-active``...) to a systemd user manager of the test's (a
        :class:`tests.support.sandbox.Sandbox`, whose runtime directory is bound into the root) as
        ``systemctl --user``; what acts on unit files stays the root's own (offline)."""
        self.bind(runtime_dir)
        keep = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
        path = self.path / BRIDGE.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={v}\n" for k, v in exports.items() if k in keep))

    def record(self, package: str | None = None) -> list[Call]:
        """The recorded calls, oldest first; only the maintainer scripts of ``package`` if given."""
        calls = []
        with contextlib.suppress(FileNotFoundError):
            for line in (self.path / RECORD.lstrip("/")).read_text().splitlines():
                tool, pkg, words = (line.split("\t") + ["", ""])[:3]
                if package is None or pkg == package:
                    calls.append(Call(tool, pkg, tuple(words.split())))
        return calls

    def clear_record(self) -> None:
        (self.path / RECORD.lstrip("/")).write_text("")

    def stop(self) -> None:
        if self._holder is not None:
            end_pid(self._holder.pid, self._starttime, self._holder, grace_s=5)
            for stream in (self._holder.stdout, self._holder.stderr):
                if stream is not None:
                    stream.close()
            self._holder = None

    def __enter__(self) -> ThrowawayRoot:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
