"""A ledger that degrades but never stops the switching, on the real daemon ("Never strand the
host", item 3): a ``ledger.db`` that is garbage at the daemon's start, a ``ledger.db`` deleted while
the daemon runs, and ``gpushift ledger`` on a garbage file.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpushift_env import Backend, GpushiftEnv, free_port

GARBAGE = b"this was a ledger until a copy went wrong\n" * 200


def two_backends(sandbox, name: str = "gs") -> GpushiftEnv:
    a = Backend("a", free_port(), [0, 1], version="1.0.0")
    b = Backend("b", free_port(), [0, 1], version="2.0.0")
    return GpushiftEnv(sandbox, Path(sandbox.base_dir) / name, [a, b], reconcile_interval_s=2)


def put_garbage(state_dir: Path) -> None:
    """``ledger.db`` becomes garbage, as after a copy gone wrong: the main file alone (a WAL left
    beside it would still hold the pages of a small ledger)."""
    for suffix in ("-wal", "-shm"):
        (state_dir / f"ledger.db{suffix}").unlink(missing_ok=True)
    (state_dir / "ledger.db").write_bytes(GARBAGE)


def head_file(env: GpushiftEnv) -> dict:
    return dict(json.loads((env.state_dir / "ledger.head").read_text()))


def restarts(env: GpushiftEnv) -> int:
    return int(env.sb.show("gpushift.service", "NRestarts")["NRestarts"])


def status_text(env: GpushiftEnv) -> str:
    return env.sb.show("gpushift.service", "StatusText")["StatusText"]


def test_garbage_ledger_at_start_daemon_switches_and_records_the_break(sandbox):
    env = two_backends(sandbox).up()
    env.cli("switch", "a", "--reason", "before the disk went bad", check=True)
    old_head = head_file(env)
    assert old_head["id"] >= 1
    env.sb.systemctl("stop", "gpushift.service")
    put_garbage(env.state_dir)
    env.start_daemon()
    # no crash loop: the daemon is up, once, and switches
    r = env.cli("switch", "b", "--reason", "after the disk went bad")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{env.daemon_log()[-3000:]}"
    assert env.active_state("gs-b.service") == "active"
    assert env.active_state("gpushift.service") == "active" and restarts(env) == 0
    # the garbage is kept for a person, under a name that says what it was
    moved = sorted(env.state_dir.glob("ledger.db.corrupt-*"))
    assert [p.read_bytes() for p in moved if not p.name.endswith(("-wal", "-shm"))] == [GARBAGE]
    # a new chain: its first row records the break and the old head; the switch is the next row
    rows = sorted(env.ledger(), key=lambda x: x["id"])
    assert [x["id"] for x in rows] == [1, 2], rows
    first = env.ledger_row(1)
    brk = first["extra"]["chain_break"]
    assert brk["reason"] == "corrupt" and brk["moved_to"] == str(moved[0])
    assert brk["old_head"]["id"] == old_head["id"] and brk["old_head"]["hash"] == old_head["hash"]
    assert first["outcome"] == "chain_break"
    assert (
        rows[1]["to"] == "b" and rows[1]["outcome"] == "ok" and rows[1]["reason"] == "after the disk went bad"
    )
    # status: the ledger recovered, and says what happened
    led = env.status()["ledger"]
    assert led["state"] == "ok" and led["pending"] == 0, led
    assert led["chain_break"]["reason"] == "corrupt", led
    assert "ledger: new chain" in status_text(env)
    # verify fails, saying that the daemon recorded the break
    v = env.cli("ledger", "verify")
    assert v.returncode != 0 and "recorded by the daemon" in v.stderr, v.stderr
    lines = [json.loads(x) for x in env.daemon_log().splitlines() if x.startswith("{")]
    assert any(x.get("event") == "ledger_chain_break" for x in lines)


def test_ledger_deleted_under_the_daemon_next_row_lands_and_the_break_is_recorded(sandbox):
    env = two_backends(sandbox).up()
    env.cli("switch", "a", "--reason", "first", check=True)
    old_head = head_file(env)
    (env.state_dir / "ledger.db").unlink()
    r = env.cli("switch", "b", "--reason", "after the delete")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    env.wait_for(lambda: (env.state_dir / "ledger.db").exists(), 10, "a new ledger.db")
    rows = sorted(env.ledger(), key=lambda x: x["id"])
    mine = [x for x in rows if x["reason"] == "after the delete"]
    assert len(mine) == 1 and mine[0]["outcome"] == "ok" and mine[0]["to"] == "b", rows
    first = env.ledger_row(rows[0]["id"])
    assert first["outcome"] == "chain_break", rows
    brk = first["extra"]["chain_break"]
    assert brk["reason"] == "deleted"
    assert brk["old_head"]["id"] == old_head["id"] and brk["old_head"]["hash"] == old_head["hash"]
    assert env.status()["ledger"]["state"] == "ok"
    v = env.cli("ledger", "verify")
    assert v.returncode != 0 and "recorded by the daemon" in v.stderr, v.stderr


def test_ledger_deleted_under_an_idle_daemon_is_noticed_without_a_switch(sandbox):
    env = two_backends(sandbox).up()
    env.cli("switch", "a", "--reason", "first", check=True)
    (env.state_dir / "ledger.db").unlink()
    # the periodic check (every reconcile interval, 2 s here) notices and records the break
    env.wait_for(
        lambda: (env.state_dir / "ledger.db").exists() and env.ledger()[:1] != [],
        20,
        "the break to be recorded without a switch",
    )
    assert env.ledger()[0]["outcome"] == "chain_break"


def test_ledger_cli_on_a_garbage_file_is_one_line_and_nonzero(sandbox):
    env = two_backends(sandbox)
    env.install()  # config only: the daemon never runs, nothing repairs the file
    env.state_dir.mkdir(parents=True, exist_ok=True)
    (env.state_dir / "ledger.db").write_bytes(GARBAGE)
    for args in (
        ("ledger", "verify"),
        ("ledger",),
        ("ledger", "--json"),
        ("ledger", "show", "1"),
        ("ledger", "diff"),
        ("ledger", "export", "--format", "jsonl"),
        ("ledger", "export", "--format", "markdown"),
    ):
        r = env.cli(*args)
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "not a database" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert (env.state_dir / "ledger.db").read_bytes() == GARBAGE  # a reader never repairs
