"""The journal, as a user reads it: the sandbox's private journald, what the units write into it, the
native protocol as journald parses it, and one switch followed by its ticket.

``journalctl -u gpushift GPUSHIFT_TICKET=…`` on a host is ``sandbox.journal("GPUSHIFT_TICKET=…")``
here: the same journald (systemd 252's), reading the same entries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support.sandbox import Sandbox

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _values(entries: list[dict], field: str) -> list:
    return [e.get(field) for e in entries]


def test_sandbox_journal_holds_the_units_output_and_stop_ends_journald(wait_for):
    sb = Sandbox().start()
    try:
        assert sb.journald is not None and sb.journald.pid is not None
        jpid = sb.journald.pid
        assert _alive(jpid)
        # it stays alive: journald reads the unit from the sender's cgroup (see tests/support/journald.py)
        sb.install_unit(
            "talker.service",
            "[Service]\nExecStart=/bin/sh -c 'echo out-line; echo err-line >&2; exec sleep 60'\n",
        )
        sb.daemon_reload()
        sb.systemctl("start", "talker.service")

        def both_lines() -> list[dict] | None:
            got = sb.journal("-u", "talker.service")
            return got if len(got) >= 2 else None

        entries = wait_for(both_lines, 10, "the unit's two lines", sb.journal_text)
        assert _values(entries, "MESSAGE") == ["out-line", "err-line"], entries
        assert set(_values(entries, "_SYSTEMD_UNIT")) == {"talker.service"}
        assert set(_values(entries, "_TRANSPORT")) == {"stdout"}
        assert list(sb.journal_dir.glob("*/system.journal")), "the journal is not in the sandbox's directory"
        # the host's /run was not used: journald's socket exists only in the sandbox's namespace
        assert not os.path.exists("/run/systemd/journal/socket") or os.path.isdir("/run/systemd/system")
    finally:
        sb.stop()
    assert not _alive(jpid)


def test_sandbox_stop_ends_journald_when_the_test_body_failed():
    sb = Sandbox()
    jpid = None
    try:
        with sb:
            jpid = sb.journald.pid if sb.journald else None
            raise RuntimeError("a failing test")
    except RuntimeError:
        pass
    assert jpid is not None and not _alive(jpid)


# The client runs as a unit of the sandbox (so in journald's namespace), with gpushift's encoder.
_NATIVE_CLIENT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from gpushift.host.journal import JournalSocket
    s = JournalSocket()
    s.send([("MESSAGE", "multi\\nline"), ("SYSLOG_IDENTIFIER", "probe"), ("PROBE_CASE", "newline")])
    s.send([("MESSAGE", b"bin\\x00ary\\xff"), ("SYSLOG_IDENTIFIER", "probe"), ("PROBE_CASE", "binary")])
    big = "x" * 400000 + "\\nend"  # far over one datagram: the memfd path
    s.send([("MESSAGE", "big"), ("PROBE_BIG", big), ("SYSLOG_IDENTIFIER", "probe"), ("PROBE_CASE", "memfd")])
    """
)


def test_native_protocol_entries_are_parsed_by_journald_exactly():
    with Sandbox() as sb:
        code = _NATIVE_CLIENT.format(repo=str(REPO))
        r = subprocess.run(
            ["systemd-run", "--user", "--wait", "--quiet", "--unit=probe", PY, "-c", code],
            env=sb.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr + sb.journal_text("-u", "probe.service")
        got = {e["PROBE_CASE"]: e for e in sb.journal("SYSLOG_IDENTIFIER=probe")}
        assert set(got) == {"newline", "binary", "memfd"}, got
        assert got["newline"]["MESSAGE"] == "multi\nline"
        assert bytes(got["binary"]["MESSAGE"]) == b"bin\x00ary\xff"
        assert got["memfd"]["PROBE_BIG"] == "x" * 400000 + "\nend"
        assert all(e["_TRANSPORT"] == "journal" for e in got.values())


def test_one_switch_is_followed_in_the_journal_by_its_ticket(sandbox):
    a = Backend("a", free_port(), [0, 1], version="1.0.0")
    b = Backend("b", free_port(), [1], version="2.0.0", vram_mib=6800)
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a, b]).up()
    first = json.loads(env.cli("switch", "a", "--json", check=True).stdout)
    second = json.loads(env.cli("switch", "b", "--reason", "night", "--json", check=True).stdout)
    assert first["ticket"] != second["ticket"]

    mine = sandbox.journal(f"GPUSHIFT_TICKET={second['ticket']}")
    assert mine, env.daemon_log()
    assert set(_values(mine, "GPUSHIFT_TICKET")) == {second["ticket"]}  # nothing of the other switch
    assert set(_values(mine, "_SYSTEMD_UNIT")) == {"gpushift.service"}
    assert set(_values(mine, "SYSLOG_IDENTIFIER")) == {"gpushift"}
    phases = [e["GPUSHIFT_PHASE"] for e in mine if e["GPUSHIFT_EVENT"] == "switch_phase"]
    assert phases[0] == "preflight" and phases[-1] in ("ready", "version"), phases
    assert {"stop", "release", "start", "ready"} <= set(phases), phases
    events = _values(mine, "GPUSHIFT_EVENT")
    # switch_requested is logged once the ticket is handed out, as the worker already runs
    assert "switch_requested" in events and events[-1] == "switch_finished", events
    done = mine[-1]
    assert done["GPUSHIFT_OUTCOME"] == "ok" and done["GPUSHIFT_BACKEND"] == "b"
    assert done["PRIORITY"] == "6" and "switch_finished" in done["MESSAGE"]
    assert all(e["GPUSHIFT_BACKEND"] == "b" for e in mine if e["GPUSHIFT_EVENT"] == "switch_requested")
    assert [e["GPUSHIFT_REASON"] for e in mine if e["GPUSHIFT_EVENT"] == "switch_requested"] == ["night"]
    # one word for the mode: without a schedule status says "manual", and so does the journal
    assert env.status()["mode"].startswith("manual"), env.status()["mode"]
    assert [e["GPUSHIFT_MODE"] for e in mine if e["GPUSHIFT_EVENT"] == "switch_requested"] == ["manual"]
    # the other switch is found by its own ticket, and `-u gpushift` works as on a host
    theirs = sandbox.journal("-u", "gpushift", f"GPUSHIFT_TICKET={first['ticket']}")
    assert theirs and set(_values(theirs, "GPUSHIFT_TICKET")) == {first["ticket"]}
    assert not set(_values(theirs, "__CURSOR")) & set(_values(mine, "__CURSOR"))
