"""Issue 20's webhook queue on the real daemon (the shipped gpushift.service under a real systemd
manager, the real CLI, stand-in backends, real local HTTP receivers): queue files that cannot be
delivered — a FIFO, a file of the wrong shape — are set aside and reported, and a later switch's
document still arrives, without the daemon restarting; a redirect to another origin is never followed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpushift_env import free_port
from test_hooks_e2e import make_env, receiver  # noqa: F401 (fixture)

from tests.support.receiver import Receiver


def test_bad_queue_files_are_set_aside_and_reported_and_a_later_switchs_document_still_arrives(
    sandbox: Any,
    receiver: Receiver,  # noqa: F811 (the fixture)
) -> None:
    env = make_env(
        sandbox,
        f"""
[notify]
webhook_url = "http://hookbot:PW-SECRET@127.0.0.1:{receiver.port}/hooks/PATH-TOKEN"
lead_s = 0
timeout_s = 2
""",
    )
    queue = env.state_dir / "webhook"
    queue.mkdir(parents=True, exist_ok=True)
    fifo = queue / "00000000000000000001-000000.json"  # older than anything the daemon names
    os.mkfifo(fifo)  # a plain open() of it waits for a writer for ever
    wrong = queue / "00000000000000000002-000000.json"
    wrong.write_text(json.dumps({"queued_at": 1.0, "attempts": 0}))  # no document
    receiver.start()
    env.up()
    pid = env.main_pid("gpushift.service")
    env.cli("switch", "a", "--reason", "after the bad files", check=True)
    (first,) = receiver.wait(1, 30)
    assert (first["event"], first["to"], first["outcome"]) == ("switch_finished", "a", "ok")
    # Both files were set aside into webhook/bad/ with their reasons, and reported.
    env.wait_for(lambda: env.status()["notices"]["webhook"]["set_aside"] == 2, 30, "both files set aside")
    moved = sorted(p.name for p in (queue / "bad").iterdir())
    assert len(moved) == 4 and [n for n in moved if n.endswith(".why")] == [
        moved[0] + ".why",
        moved[2] + ".why",
    ], moved
    assert not fifo.exists() and not wrong.exists()
    log = env.daemon_log()
    lines = [json.loads(x) for x in log.splitlines() if '"webhook_file_set_aside"' in x]
    assert [(e["file"], e["why"]) for e in lines] == [
        (str(fifo), "not a regular file (FIFO)"),
        (str(wrong), "not a queued document: no document object under 'doc'"),
    ], log[-3000:]
    st = env.status()["notices"]["webhook"]
    assert st["last_set_aside"]["file"] == str(wrong)
    assert st["last_error"] == f"queue file {wrong.name} set aside: {lines[1]['why']}"
    assert "set aside" in env.cli("status", check=True).stdout  # the plain status's webhook line
    # The rest of the queue goes on: a later switch's document arrives too, same daemon.
    env.cli("switch", "b", "--reason", "and after that", check=True)
    docs = receiver.wait(2, 30)
    assert (docs[1]["to"], docs[1]["outcome"]) == ("b", "ok")
    assert env.main_pid("gpushift.service") == pid
    shown = env.daemon_log() + json.dumps(env.status())
    for secret in ("PW-SECRET", "PATH-TOKEN", "hookbot"):
        assert secret not in shown


def test_a_redirect_to_another_origin_is_not_followed_and_the_document_is_retried_to_the_configured_url(
    sandbox: Any,
    receiver: Receiver,  # noqa: F811 (the fixture)
) -> None:
    other = Receiver(port=free_port()).start()  # the Location's origin
    try:
        receiver.script = [(302, {"Location": other.url + "/collect"})]
        env = make_env(
            sandbox,
            f"""
[notify]
webhook_url = "http://hookbot:PW-SECRET@127.0.0.1:{receiver.port}/hooks/PATH-TOKEN"
lead_s = 0
timeout_s = 2
""",
        )
        receiver.start()
        env.up()
        env.cli("switch", "a", check=True)
        (got,) = receiver.wait(1, 30)  # the 302 was a failed delivery; the retry went to the same URL
        assert (got["to"], got["outcome"]) == ("a", "ok")
        assert [(p.path, p.status) for p in receiver.posts] == [
            ("/hooks/PATH-TOKEN", 302),
            ("/hooks/PATH-TOKEN", 200),
        ]
        assert other.requests == []  # nothing reached the other origin: no GET, no credentials
        retry = [json.loads(x) for x in env.daemon_log().splitlines() if '"webhook_retry"' in x]
        assert retry and retry[0]["error"] == f"HTTP 302: a redirect to {other.url}/***, not followed"
        st = env.status()["notices"]["webhook"]
        assert st["delivered"] == 1 and "redirect" in st["last_error"]
    finally:
        other.stop()
