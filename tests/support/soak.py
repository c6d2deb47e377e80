"""The soak (issue 10, item 7): the real daemon, a bad day of random events, independent witnesses.

:class:`Soak` drives a running gpushift (a ``GpushiftEnv`` of ``tests/integration``: the shipped unit
under a private systemd user manager) whose two stand-in backends share both simulated GPUs and whose
units carry no ``Conflicts=``, so one backend at a time is gpushift's doing alone.  Each event is one
of :data:`WEIGHTS`' kinds; a phase of a switch is reached through the stand-ins' behaviour (a stop
that takes a while, a release delay, a slow health URL, a request in flight) and found on the CLI's
progress lines, which are the daemon's ``Progress`` signals.  Nothing in the product is a test hook.

After every event the soak waits (a bounded time) for the host to serve what the driver's own model
says the schedule or the override wants, then checks, with witnesses that are not gpushift:

* ``one_backend``: never two backend units active at once (systemd, polled), and no stand-in saw
  another backend holding its device at its start (the stand-in's ``--witness`` line);
* ``vram_free_at_start``: no stand-in saw a foreign process holding its device at its start;
* ``launch_recorded``: every start a stand-in witnessed lies inside a ledger row about its backend
  (or a spooled one, while the disk is full);
* ``ledger_verify``: ``gpushift ledger verify`` passes, or names exactly the break it was told about;
* ``serves_wanted``: the host serves what the schedule or the override wants, within the bound;
* ``daemon_survives``: a flood of ``/metrics`` connections neither restarts the daemon nor stops it
  answering;
* ``no_foreign_ok``: while another user's process answers on the target's port (``port_impostor``),
  the switch does not end ok, its failure names that process, and no ``ok`` row carries the version
  it claimed.

``python -m pytest tests/integration/test_soak.py`` runs the short version; ``make soak`` runs 1,000
events and writes the report (:func:`report_markdown`) into ``docs/reliability.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from . import impostor
from .diskfull import fill

#: Event kinds and their weights in the random draw.  The first events are every kind once (in a
#: random order), so even a short soak has each.
WEIGHTS: dict[str, int] = {
    "switch": 12,
    "hold": 4,
    "resume": 5,
    "switch_off": 2,
    "cancel": 7,
    "kill_daemon": 7,
    "backend_exit_0": 3,
    "backend_exit_1": 3,
    "backend_hang": 2,
    "foreign_vram": 4,
    "reload_good": 4,
    "reload_bad": 4,
    "clock_jump": 6,
    "ledger_disk_full": 3,
    "ledger_replaced": 4,
    "listener_flood": 3,
    "port_impostor": 3,
}

#: The phases a switch reports, in order; the soak kills the daemon or cancels in one of them.
PHASES = ["preflight", "intent", "drain", "stop", "release", "start", "ready", "warmup", "version"]
KILL_PHASES = ["idle", "preflight", "drain", "stop", "release", "start", "ready", "version"]
CANCEL_PHASES = ["preflight", "drain", "stop", "release", "start", "ready"]

INVARIANTS = (
    "one_backend",
    "vram_free_at_start",
    "launch_recorded",
    "ledger_verify",
    "serves_wanted",
    "daemon_survives",
    "no_foreign_ok",
)

#: The listener flood: idle connections held open on /metrics while a switch runs (the listener
#: keeps at most 64 of them; the rest wait in the kernel's accept queue or are refused).
FLOOD_CONNECTIONS = 400

#: The schedule the soak's daemon runs: ``a`` from 06:00, ``b`` from 18:00 (UTC, every day).
SCHEDULE_TEXT = "TZ=UTC\n0 6 * * * a\n0 18 * * * b\n"
_ENTRIES = ((6, "a"), (18, "b"))

CONVERGE_S = 90.0  # the bound on "within a bounded time the host serves what is wanted"
GARBAGE = b"not a ledger any more: the soak replaced it\n" * 100


def scheduled(t: datetime) -> str:
    """What :data:`SCHEDULE_TEXT` wants at ``t``: the entry that fired most recently at or before it."""
    hours = [h for h, _ in _ENTRIES]
    h = t.astimezone(timezone.utc).hour
    if h < hours[0]:
        return _ENTRIES[-1][1]
    return [name for hh, name in _ENTRIES if hh <= h][-1]


def next_boundary(t: datetime) -> datetime:
    """The first entry time of :data:`SCHEDULE_TEXT` after ``t``."""
    t = t.astimezone(timezone.utc)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    times = [day + timedelta(days=d, hours=h) for d in (0, 1) for h, _ in _ENTRIES]
    return min(x for x in times if x > t)


def parse_time(s: str | None) -> datetime | None:
    return datetime.fromisoformat(s) if s else None


@dataclass
class Stats:
    """What the soak did and found: the report's figures."""

    events: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    recoveries: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    kill_phases: Counter[str] = field(default_factory=Counter)
    cancel_phases: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    starts: int = 0
    seconds: float = 0.0


class Soak:
    """Drives ``env`` (a started ``GpushiftEnv`` as set up by ``tests/integration/test_soak.py``).

    Args:
        env: The environment; its backends are ``a`` and ``b`` on GPUs 0 and 1.
        seed: The random draw's seed (the same seed gives the same events).
        witness: The file the stand-ins append their ``--witness`` lines to.
        clock_file: libfaketime's timestamp file of the daemon (an offset like ``+7200``).
        filler: A file on the state directory's small filesystem, written until the disk is full.
        log: Where each event and its checks are written, one JSON line each.
    """

    def __init__(self, env: Any, seed: int, witness: Path, clock_file: Path, filler: Path, log: Path) -> None:
        self.env = env
        self.rng = random.Random(seed)
        self.witness = witness
        self.clock_file = clock_file
        self.filler = filler
        self.log_path = log
        self.stats = Stats()
        self.offset_s = 0.0
        self.offsets: list[tuple[float, float]] = [(0.0, 0.0)]  # (real time set, offset) in order
        self.override: tuple[str, datetime | None] | None = None  # backend, until (None: hold)
        self.uncertain = False  # the last event's effect on the override is read back from status
        self.witness_pos = 0
        self.unmatched: list[dict[str, Any]] = []  # witnessed starts not yet found in the ledger
        self.breaks_told: list[str] = []  # the ledger replacements done, by kind
        self.index = 0
        self.kind = "start of the soak"
        self.event_violations: list[str] = []
        clock_file.write_text("+0\n")

    # ------------------------------------------------------------------ the model

    def fake_now(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=self.offset_s)

    def real_of(self, fake: datetime) -> float:
        """The real time at which the daemon's clock read ``fake`` (offsets only grow, set while idle)."""
        ts = fake.timestamp()
        for since, off in reversed(self.offsets):
            if ts - off >= since:
                return ts - off
        return ts

    def wanted(self) -> str:
        now = self.fake_now()
        if self.override is not None:
            backend, until = self.override
            if until is None or now < until:
                return backend
            self.override = None
        return scheduled(now)

    def set_override(self, backend: str, hold: bool) -> None:
        self.override = (backend, None if hold else next_boundary(self.fake_now()))

    # ------------------------------------------------------------------ helpers

    def violation(self, invariant: str, what: str) -> None:
        line = f"event {self.index} ({self.kind}): {invariant}: {what}"
        self.event_violations.append(line)
        self.stats.violations.append(line)
        # the daemon's log as it was then, beside the event log (the end of a long run is too late)
        with contextlib.suppress(Exception):  # a lost dump must not end the soak
            dump = self.log_path.with_name(f"{self.log_path.stem}.violation-{self.index}.log")
            dump.write_text(f"{line}\n\n{self.env.daemon_log()[-60000:]}\n")

    def check(self, invariant: str, ok: bool, what: str) -> bool:
        self.stats.checks[invariant] += 1
        if not ok:
            self.violation(invariant, what)
        return ok

    def states(self) -> dict[str, str]:
        return {n: self.env.active_state(b.unit) for n, b in self.env.backends.items()}

    def check_one_active(self, states: dict[str, str]) -> None:
        up = [n for n, s in states.items() if s in ("active", "activating", "reloading")]
        self.check("one_backend", len(up) <= 1, f"units active at once: {states}")

    def health(self, name: str, timeout_s: float = 1.0) -> int | None:
        url = f"http://127.0.0.1:{self.env.backends[name].port}/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (OSError, ValueError):
            return None

    def post(self, name: str, path: str, body: dict[str, Any], timeout_s: float = 5.0) -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.env.backends[name].port}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with contextlib.suppress(OSError):  # an exit may cut the answer short
            urllib.request.urlopen(req, timeout=timeout_s).read()

    def serving(self) -> str | None:
        """The backend whose unit is active (None: none, or more than one)."""
        up = [n for n, s in self.states().items() if s == "active"]
        return up[0] if len(up) == 1 else None

    def other(self, name: str | None) -> str:
        return "b" if name == "a" else "a"

    def daemon_pid(self) -> int:
        return int(self.env.sb.show("gpushift.service", "MainPID")["MainPID"])

    def wait(self, pred: Callable[[], Any], timeout_s: float, what: str) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.2)
        self.stats.notes[f"timed out: {what}"] += 1
        return False

    def follow_switch(self, target: str, *flags: str) -> tuple[subprocess.Popen[str], list[str]]:
        """A ``gpushift switch TARGET --json`` in the background; its progress lines (the daemon's
        Progress signals) collected as they come, phase first."""
        proc = self.env.cli_popen("switch", target, "--json", *flags)
        phases: list[str] = []

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                parts = line.split("]", 1)
                if len(parts) == 2 and parts[1].split():
                    phases.append(parts[1].split()[0])

        threading.Thread(target=read, daemon=True).start()
        return proc, phases

    @staticmethod
    def reached(phases: list[str], target: str) -> bool:
        if not phases or target not in PHASES:
            return bool(phases)
        last = phases[-1]
        return last in PHASES and PHASES.index(last) >= PHASES.index(target)

    @staticmethod
    def result(proc: subprocess.Popen[str], timeout_s: float = 150) -> dict[str, Any]:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            return {"ok": False, "message": "the CLI did not return"}
        try:
            return dict(json.loads(out))
        except ValueError:
            return {"ok": False, "message": f"no JSON: {out[-300:]!r}", "rc": proc.returncode}

    # ------------------------------------------------------------------ events

    def ev_switch(self, hold: bool = False, target: str | None = None) -> None:
        target = target or self.rng.choice(["a", "b"])
        flags = ["--hold"] if hold else []
        if self.rng.random() < 0.3:
            flags.append("--now")
        proc, _ = self.follow_switch(target, *flags)
        res = self.result(proc)
        if res.get("ok"):
            self.set_override(target, hold)
        else:
            self.stats.notes[f"{self.kind} not ok: {res.get('outcome') or res.get('message', '')[:80]}"] += 1
            self.uncertain = True

    def ev_hold(self) -> None:
        self.ev_switch(hold=True)

    def ev_switch_off(self) -> None:
        self.ev_switch(target="off")

    def ev_resume(self) -> None:
        r = self.env.cli("resume")
        if r.returncode == 0:
            self.override = None
        else:
            self.uncertain = True

    def ev_cancel(self) -> None:
        target = self.other(self.serving())
        phase = self.rng.choice(CANCEL_PHASES)
        if phase == "drain":
            self.request_in_flight()
        proc, phases = self.follow_switch(target)
        self.wait(lambda: self.reached(phases, phase) or proc.poll() is not None, 60, f"phase {phase}")
        seen = phases[-1] if phases else "none"
        self.env.cli("cancel")
        self.stats.cancel_phases[seen] += 1
        res = self.result(proc)
        if res.get("ok"):
            self.set_override(target, False)
        else:
            self.uncertain = True

    def request_in_flight(self) -> None:
        """A slow request on the serving backend: the drain phase waits for it."""
        name = self.serving()
        if name is not None:
            body = {"prompt": "soak", "sleep": 2.5}
            threading.Thread(
                target=self.post, args=(name, "/v1/completions", body, 10.0), daemon=True
            ).start()
            time.sleep(0.2)

    def kill_daemon_now(self) -> bool:
        pid = self.daemon_pid()
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        ok = self.wait(
            lambda: (
                self.env.sb.show("gpushift.service", "MainPID")["MainPID"] not in ("0", str(pid))
                and self.env.active_state("gpushift.service") == "active"
            ),
            60,
            "systemd to restart the daemon",
        )
        self.stats.recoveries["daemon restarted by systemd"].append(time.monotonic() - t0)
        return ok

    def ev_kill_daemon(self) -> None:
        phase = self.rng.choice(KILL_PHASES)
        if phase == "idle":
            self.stats.kill_phases["idle"] += 1
            self.kill_daemon_now()
            return
        target = self.other(self.serving())
        hold = self.rng.random() < 0.25
        if phase == "drain":
            self.request_in_flight()
        proc, phases = self.follow_switch(target, *(["--hold"] if hold else []))
        self.wait(lambda: self.reached(phases, phase) or proc.poll() is not None, 60, f"phase {phase}")
        if proc.poll() is not None:  # finished before the phase was seen: kill it idle
            self.stats.kill_phases["after the switch"] += 1
        else:
            self.stats.kill_phases[phases[-1] if phases else "none"] += 1
        self.kill_daemon_now()
        res = self.result(proc)
        if res.get("ok") or not res.get("outcome"):
            # done, or cut off by the kill: the run's target for a manual switch is what the
            # recovery must bring up
            self.set_override(target, hold)
        else:
            # the daemon answered before the kill that it did not switch (refused: VRAM still held
            # by the foreign process of an event before): the override follows what runs
            self.stats.notes[f"kill_daemon: the switch ended {res.get('outcome')} before the kill"] += 1
            self.uncertain = True

    def backend_exit(self, status: int) -> None:
        name = self.serving()
        if name is None:
            self.stats.notes["nothing serving to exit"] += 1
            return
        unit = self.env.backends[name].unit
        pid = self.env.main_pid(unit)
        self.post(name, "/control", {"exit": status})
        # gone before the checks begin (else a check could find the old process still serving)
        self.wait(lambda: self.env.main_pid(unit) != pid, 20, "the backend to exit")

    def ev_backend_exit_0(self) -> None:
        self.backend_exit(0)

    def ev_backend_exit_1(self) -> None:
        self.backend_exit(1)

    def ev_backend_hang(self) -> None:
        name = self.serving()
        if name is None:
            self.stats.notes["nothing serving to hang"] += 1
            return
        mode = self.rng.choice(["hang", "fail"])
        self.stats.notes[f"health {mode}"] += 1
        self.post(name, "/_standin/health", {"mode": mode})

    def ev_foreign_vram(self) -> None:
        gpu = self.rng.choice([0, 1])
        holder = self.env.hold_device(gpu)
        path = str(self.env.simdir / f"nvidia{gpu}")
        try:
            self.wait(lambda: _holds(holder.pid, path), 10, "the foreign holder to open the device")
            serving = self.serving()
            if serving is not None and self.rng.random() < 0.5:
                self.stats.notes["foreign vram: backend crashes meanwhile"] += 1
                self.backend_exit(1)
                time.sleep(3)  # the relaunch must wait at the closed gate (the witness would see it)
            else:
                self.stats.notes["foreign vram: switch asked"] += 1
                r = self.env.cli("switch", self.other(serving), "--json", timeout_s=120)
                self.check(
                    "vram_free_at_start",
                    r.returncode != 0,
                    f"a switch while GPU {gpu} was held by a foreign process succeeded: {r.stdout[-300:]}",
                )
                self.uncertain = True
        finally:
            holder.terminate()
            holder.wait(10)

    def ev_listener_flood(self) -> None:
        """Hundreds of idle connections and one client trickling its request head, held on /metrics
        while a switch runs: the daemon keeps its PID (it aborted when descriptors ran out) and the
        switch and a status still answer."""
        import socket

        host, _, port = self.env.metrics_listen.rpartition(":")
        pid, restarts = self.daemon_pid(), self.env.sb.show("gpushift.service", "NRestarts")["NRestarts"]
        held: list[socket.socket] = []
        try:
            for _ in range(FLOOD_CONNECTIONS):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError, OSError):
                    s.connect((host.strip("[]"), int(port)))
                held.append(s)
            slow = held[0]
            with contextlib.suppress(OSError):
                slow.send(b"GET /metr")  # a head that never ends
            self.ev_switch()
            st = self.status_or_none()
            self.check("daemon_survives", st is not None, "status did not answer during a /metrics flood")
        finally:
            for s in held:
                s.close()
        now = self.env.sb.show("gpushift.service", "MainPID", "NRestarts")
        self.check(
            "daemon_survives",
            now["MainPID"] == str(pid) and now["NRestarts"] == restarts,
            f"the daemon was restarted during a /metrics flood (pid {pid} -> {now['MainPID']}, "
            f"restarts {restarts} -> {now['NRestarts']})",
        )

    def ev_port_impostor(self) -> None:
        """Another user's process binds the target's port while the serving backend stops, and
        answers 200 with a version of its own: the switch must fail, naming it or the target's exit
        (it cannot bind its port), and no ``ok`` row may carry that version; the rollback brings the previous
        backend back.  The impostor is gone before the checks (the host can serve the target again)."""
        target = self.other(self.serving())
        proc, phases = self.follow_switch(target)
        self.wait(lambda: self.reached(phases, "stop") or proc.poll() is not None, 60, "phase stop")
        imp = impostor.start(self.env.backends[target].port)
        try:
            assert imp.stdout is not None
            bound = imp.stdout.readline().startswith("listening")  # or it exits: the port was taken
            res = self.result(proc)
            self.uncertain = True
            if not bound:
                self.stats.notes["port impostor: the target had bound its port first"] += 1
                return
            self.stats.notes[f"port impostor: the switch ended {res.get('outcome')}"] += 1
            self.check(
                "no_foreign_ok",
                not res.get("ok"),
                f"the switch to {target} ended ok while PID {imp.pid} held its port: {str(res)[:300]}",
            )
            # Two failures are right, whichever the daemon sees first: the impostor's answer
            # (named) or the target's own exit, unable to bind the port the impostor holds.
            message = str(res.get("message"))
            self.check(
                "no_foreign_ok",
                f"PID {imp.pid}" in message or "exited while starting" in message,
                f"the failure names neither the impostor (PID {imp.pid}) nor the target's exit: {message[:300]}",
            )
            claimed = self.ok_rows_with_version(impostor.VERSION)
            self.check("no_foreign_ok", not claimed, f"ok rows with the impostor's version: {claimed}")
        finally:
            imp.terminate()
            try:
                imp.wait(10)
            except subprocess.TimeoutExpired:
                imp.kill()
                imp.wait(10)

    def ok_rows_with_version(self, version: str) -> list[int]:
        """Ids of ``ok`` rows whose backend version is ``version`` (ledger.db read-only, and the spool)."""
        ids: list[int] = []
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(f"file:{self.env.state_dir / 'ledger.db'}?mode=ro", uri=True, timeout=5)
            try:
                q = "SELECT id FROM switches WHERE outcome = 'ok' AND backend_version = ?"
                ids = [int(x[0]) for x in db.execute(q, (version,))]
            finally:
                db.close()
        spool = self.env.runtime_dir / "ledger-pending"
        for p in sorted(spool.glob("*.json")) if spool.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(p.read_text())
                rec = rec.get("record", rec) if isinstance(rec, dict) else {}
                if rec.get("outcome") == "ok" and rec.get("backend_version") == version:
                    ids.append(-1)
        return ids

    def ev_reload_good(self) -> None:
        # a key a reload applies (backends and the GPU provider need a restart: a reload refuses them)
        lines = self.env.opts["daemon_lines"]
        self.env.opts["daemon_lines"] = [
            ("retry_after_s = 3" if x == "retry_after_s = 2" else "retry_after_s = 2")
            if x.startswith("retry_after_s")
            else x
            for x in lines
        ]
        self.env.write_config()
        r = self.env.cli("reload")
        if r.returncode != 0:
            self.violation("serves_wanted", f"a good config was refused: {r.stderr.strip()[-300:]}")

    def ev_reload_bad(self) -> None:
        good = self.env.config_text()
        bad = self.rng.choice(
            [
                good.replace("[gpu]", "[gpu"),  # not TOML
                good.replace('on_failure = "rollback"', 'on_failure = "sometimes"'),  # a bad value
                good + "\n[backends.a]\nunit = 3\n",  # a table twice
            ]
        )
        self.env.write_config(bad)
        try:
            r = self.env.cli("reload")
            if r.returncode == 0:
                self.violation("serves_wanted", "a bad config was accepted by reload")
        finally:
            self.env.write_config(good)  # a restart later must find a good file

    def ev_clock_jump(self) -> None:
        hours = self.rng.choice([1, 2, 3, 5, 7, 11, 13])
        self.offset_s += hours * 3600 + self.rng.randint(0, 59) * 60
        self.offsets.append((time.time(), self.offset_s))
        tmp = self.clock_file.with_name(self.clock_file.name + ".tmp")
        tmp.write_text(f"+{int(self.offset_s)}\n")
        os.replace(tmp, self.clock_file)  # never an empty file for libfaketime to read
        self.stats.notes[f"clock +{hours}h"] += 1
        # libfaketime reads the file again only once its 1 s cache has run out: until the daemon's
        # clock shows the jump, a switch asked now would get an override ending at the boundary the
        # daemon saw before it (which the jump may have passed), and the model would disagree.
        self.wait(self.daemon_sees_clock, 10, "the daemon to see the clock jump")

    def daemon_sees_clock(self) -> bool:
        """Whether the daemon's next boundary (status) is the one after the soak's fake now."""
        st = self.status_or_none() or {}
        nxt = ((st.get("schedule") or {}).get("next") or {}).get("at")
        return parse_time(nxt) == next_boundary(self.fake_now())

    def ev_ledger_disk_full(self) -> None:
        fill(self.filler)
        try:
            target = self.other(self.serving())
            r = self.env.cli("switch", target, "--json", "--reason", f"soak {self.index}: disk full")
            if self.check(
                "serves_wanted", r.returncode == 0, f"a switch on a full disk failed: {r.stderr[-300:]}"
            ):
                self.set_override(target, False)
            else:
                self.uncertain = True
            st = self.env.status()
            if (st.get("ledger") or {}).get("state") != "degraded":
                self.stats.notes["disk full: the row still fitted"] += 1
            self.check_starts_recorded(final=False)  # the row is in the spool now
        finally:
            self.filler.unlink(missing_ok=True)
        t0 = time.monotonic()
        ok = self.wait(lambda: (self.env.status().get("ledger") or {}).get("state") == "ok", 60, "ledger ok")
        self.check("ledger_verify", ok, "the ledger did not come back from degraded within 60 s")
        self.stats.recoveries["ledger back from a full disk"].append(time.monotonic() - t0)

    def ev_ledger_replaced(self) -> None:
        db = self.env.state_dir / "ledger.db"
        how = self.rng.choice(["garbage", "deleted"])
        if how == "garbage":
            tmp = db.with_name("ledger.db.soak-tmp")
            tmp.write_bytes(GARBAGE)
            os.replace(tmp, db)  # a new file under the name: a copy gone wrong
        else:
            db.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            db.with_name(f"ledger.db{suffix}").unlink(missing_ok=True)
        self.breaks_told.append(how)
        t0 = time.monotonic()
        ok = self.wait(lambda: self.verify()[0], 60, "the break to be recorded")
        self.check("ledger_verify", ok, f"the ledger {how} was not recorded as a break within 60 s")
        self.stats.recoveries[f"ledger {how}: break recorded"].append(time.monotonic() - t0)

    # ------------------------------------------------------------------ the checks

    def converge(self, t0: float) -> None:
        """Until the host serves what is wanted and the daemon is idle, at most :data:`CONVERGE_S`."""
        deadline = t0 + CONVERGE_S
        last: dict[str, Any] = {}
        adopted = False
        while True:
            states = self.states()
            self.check_one_active(states)
            if self.uncertain and not adopted:
                st = self.status_or_none()
                if st is not None and st["daemon"].get("switch") is None:
                    self.adopt(st)
                    adopted = True
            want = self.wanted()
            others_down = all(s not in ("active", "activating") for n, s in states.items() if n != want)
            if want == "off":
                up = others_down
            else:
                up = states.get(want) == "active" and others_down and self.health(want) == 200
            if up:
                st = self.status_or_none()
                if (
                    st is not None
                    and st["daemon"].get("state") == "idle"
                    and st["daemon"].get("switch") is None
                ):
                    if self.uncertain and not adopted:
                        self.adopt(st)
                        adopted = True
                        continue
                    self.check_declared(st, want)
                    self.check("serves_wanted", True, "")
                    self.stats.recoveries[f"{self.kind}: serving again"].append(time.monotonic() - t0)
                    self.uncertain = False
                    return
                last = st or {}
            else:
                last = {"states": states, "want": want}
            if time.monotonic() > deadline:
                st = self.status_or_none() or {}
                self.check(
                    "serves_wanted",
                    False,
                    f"not serving {want} within {CONVERGE_S:g} s: units {states}, daemon "
                    f"{(st.get('daemon') or {}).get('state')}, mode {st.get('mode')!r}, blocked "
                    f"{st.get('blocked')!r}; last {str(last)[:200]}",
                )
                self.uncertain = True  # carry on from what the daemon says
                return
            time.sleep(0.3)

    def status_or_none(self) -> dict[str, Any] | None:
        try:
            st: dict[str, Any] = self.env.status()
            return st if "daemon" in st else None
        except AssertionError:
            return None

    def adopt(self, st: dict[str, Any]) -> None:
        """After an event whose effect on the override the model cannot know (a refused or cancelled
        switch), take the override the daemon shows."""
        ov = st.get("override")
        if ov is None:
            self.override = None
        else:
            self.override = (
                str(ov["backend"]),
                None if ov["mode"] == "hold" else parse_time(ov.get("until")),
            )
        self.stats.notes["override read back after an uncertain event"] += 1

    def check_declared(self, st: dict[str, Any], want: str) -> None:
        ov = st.get("override")
        declared = ov["backend"] if ov else (st.get("schedule") or {}).get("wants")
        self.check("serves_wanted", declared == want, f"the daemon wants {declared!r}, the model {want!r}")

    def new_witness_lines(self) -> list[dict[str, Any]]:
        if not self.witness.exists():
            return []
        with open(self.witness, "rb") as f:
            f.seek(self.witness_pos)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.witness_pos += end
        return [json.loads(x) for x in data[:end].splitlines() if x.strip()]

    def check_witnesses(self) -> None:
        for w in self.new_witness_lines():
            self.stats.starts += 1
            w["backend"] = next(
                (n for n, b in self.env.backends.items() if str(w.get("cgroup", "")).endswith("/" + b.unit)),
                "?",
            )
            self.unmatched.append(w)
            backends = [
                o
                for o in w["others"]
                if str(o.get("cgroup") or "").endswith(".service") and "/gs-" in str(o.get("cgroup"))
            ]
            foreign = [o for o in w["others"] if o not in backends]
            self.check(
                "one_backend",
                not backends,
                f"{w['backend']} (pid {w['pid']}) started while {backends} held its GPU",
            )
            self.check(
                "vram_free_at_start",
                not foreign,
                f"{w['backend']} (pid {w['pid']}) started while {foreign} held its GPU",
            )

    def rows(self) -> list[dict[str, Any]]:
        """The newest rows, read from ``ledger.db`` itself (read-only), and the spooled ones."""
        rows: list[dict[str, Any]] = []
        with contextlib.suppress(sqlite3.Error):
            db = sqlite3.connect(f"file:{self.env.state_dir / 'ledger.db'}?mode=ro", uri=True, timeout=5)
            try:
                q = "SELECT from_backend, to_backend, started_at, finished_at FROM switches ORDER BY id DESC LIMIT 60"
                rows = [
                    dict(zip(("from", "to", "started_at", "finished_at"), x, strict=True))
                    for x in db.execute(q)
                ]
            finally:
                db.close()
        spool = self.env.runtime_dir / "ledger-pending"
        for p in sorted(spool.glob("*.json")) if spool.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(p.read_text())
                rows.append(rec.get("record", rec) if isinstance(rec, dict) else {})
        return rows

    def covers(self, row: dict[str, Any], w: dict[str, Any]) -> bool:
        if w["backend"] not in (row.get("to"), row.get("from")):
            return False
        start = parse_time(row.get("started_at"))
        end = parse_time(row.get("finished_at") or row.get("ended_at"))
        if start is None:
            return False
        t = float(w["time"])
        return self.real_of(start) - 2 <= t and (end is None or t <= self.real_of(end) + 2)

    def check_starts_recorded(self, final: bool = True) -> None:
        if final:
            self.stats.checks["launch_recorded"] += 1
        deadline = time.monotonic() + (15 if final else 3)
        while self.unmatched:
            rows = self.rows()
            self.unmatched = [w for w in self.unmatched if not any(self.covers(r, w) for r in rows)]
            if not self.unmatched or time.monotonic() > deadline:
                break
            time.sleep(1)
        if final:
            for w in self.unmatched:
                self.check(
                    "launch_recorded", False, f"{w['backend']} started (pid {w['pid']}) with no ledger row"
                )
            self.stats.checks["launch_recorded"] += 1
            self.unmatched = []

    def verify(self) -> tuple[bool, str]:
        """Whether ``ledger verify`` says what it must: intact, or exactly the break the soak made."""
        r = self.env.cli("ledger", "verify", "--json")
        try:
            v = json.loads(r.stdout)
        except ValueError:
            return False, f"verify printed no JSON (exit {r.returncode}): {r.stderr.strip()[-300:]}"
        if not self.breaks_told:
            return r.returncode == 0 and v.get("ok") is True, f"exit {r.returncode}: {r.stdout[-400:]}"
        breaks = v.get("breaks") or []
        told = {"garbage": ("corrupt", "replaced"), "deleted": ("deleted",)}[self.breaks_told[-1]]
        ok = (
            r.returncode != 0
            and not v.get("problem")
            and len(breaks) == 1
            and str(breaks[0].get("reason")) in told
        )
        return ok, f"exit {r.returncode}, told {self.breaks_told[-1]}: {r.stdout[-400:]}"

    def check_after(self, t0: float) -> None:
        self.converge(t0)
        verified: list[tuple[bool, str]] = []
        # the CLI's verify runs meanwhile (the checks are independent reads)
        verifier = threading.Thread(target=lambda: verified.append(self.verify()), daemon=True)
        verifier.start()
        self.check_witnesses()
        self.check_starts_recorded()
        verifier.join(120)
        ok, what = verified[0] if verified else (False, "ledger verify did not return")
        self.check("ledger_verify", ok, what)
        self.check_one_active(self.states())

    # ------------------------------------------------------------------ the run

    def draw(self, n: int) -> list[str]:
        kinds = list(WEIGHTS)
        self.rng.shuffle(kinds)
        rest = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=max(0, n - len(kinds)))
        return (kinds + rest)[:n]

    def run(self, n: int, deadline_s: float | None = None) -> Stats:
        """``n`` events (fewer when ``deadline_s`` passes first: the stats say how many ran)."""
        t_start = time.monotonic()
        # the daemon's first choice: the schedule's
        self.check_after(t_start)
        with open(self.log_path, "a") as log:
            for i, kind in enumerate(self.draw(n), 1):
                if deadline_s is not None and time.monotonic() - t_start > deadline_s:
                    self.stats.notes["stopped at the deadline"] += 1
                    break
                self.index, self.kind, self.event_violations = i, kind, []
                t0 = time.monotonic()
                getattr(self, f"ev_{kind}")()
                self.check_after(t0)
                self.stats.events[kind] += 1
                log.write(
                    json.dumps(
                        {
                            "event": i,
                            "kind": kind,
                            "seconds": round(time.monotonic() - t0, 2),
                            "want": self.wanted(),
                            "violations": self.event_violations,
                        }
                    )
                    + "\n"
                )
                log.flush()
        self.stats.seconds = time.monotonic() - t_start
        return self.stats


def _holds(pid: int, path: str) -> bool:
    target = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
    return False


# ---------------------------------------------------------------------- the report


def _secs(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.1f} / {statistics.median(xs):.1f} / {max(xs):.1f}"


def report_markdown(stats: Stats, seed: int, command: str, commit: str) -> str:
    """The "Soak" section's body: the command, the events per kind, the checks, the recoveries."""
    lines = [
        f"Command: `{command}` (seed {seed}, at commit `{commit}`): {sum(stats.events.values())} events "
        f"in {stats.seconds / 60:.0f} min, {stats.starts} backend starts witnessed, "
        f"**{len(stats.violations)} invariant violations**.",
        "",
        "| event kind | events |",
        "|---|---|",
        *(f"| `{k}` | {stats.events[k]} |" for k in WEIGHTS),
        "",
        "| invariant (after every event) | checks | violations |",
        "|---|---|---|",
    ]
    for inv in INVARIANTS:
        bad = sum(1 for v in stats.violations if f": {inv}: " in v)
        lines.append(f"| `{inv}` | {stats.checks[inv]} | {bad} |")
    lines += [
        "",
        "| recovery (from the event to the host serving what is wanted, daemon idle) | times | min / median / max (s) |",
        "|---|---|---|",
    ]
    for name in sorted(stats.recoveries):
        xs = stats.recoveries[name]
        lines.append(f"| {name} | {len(xs)} | {_secs(xs)} |")
    lines += [
        "",
        "Where the daemon was killed (the last progress line seen): "
        + ", ".join(f"{k} {v}" for k, v in sorted(stats.kill_phases.items()))
        + ". Where a switch was cancelled: "
        + ", ".join(f"{k} {v}" for k, v in sorted(stats.cancel_phases.items()))
        + ".",
    ]
    if stats.notes:
        lines += ["", "Notes: " + "; ".join(f"{k}: {v}" for k, v in sorted(stats.notes.items())) + "."]
    if stats.violations:
        lines += ["", "Violations:", "", *(f"- {v}" for v in stats.violations[:50])]
    return "\n".join(lines) + "\n"


BEGIN = "<!-- soak:begin (written by make soak) -->"
END = "<!-- soak:end -->"


def write_report(doc: Path, body: str) -> None:
    """Replace what lies between :data:`BEGIN` and :data:`END` in ``doc`` with ``body``."""
    text = doc.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        raise ValueError(f"{doc} has no {BEGIN} marker")
    doc.write_text(f"{head}{BEGIN}\n{body}{END}{tail}")
