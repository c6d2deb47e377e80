"""The webhook sender against a real local HTTP receiver (tests/support/receiver.py): delivery in
order, back-off while the receiver is down, Retry-After, statuses that are not retried, the queue
on disk across a restart, its bound, a day's limit, and no credential in any log line.  Under
attack (issue 20): a redirect is never followed (nothing reaches the second origin, the delivery is
a failure and retried), ``timeout_s`` bounds a receiver that trickles its headers, and a queue file
that cannot be delivered is set aside while the rest of the queue goes on."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushift.config.hooks import NotifyConfig
from gpushift.notify import webhook
from gpushift.notify.webhook import WebhookSender, split_auth
from tests.support.receiver import Receiver, Trickler


class Log:
    """The structlog calls the sender makes, kept (event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def _add(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))

    info = warning = error = exception = debug = _add

    def events(self, name: str) -> list[dict[str, Any]]:
        return [kw for e, kw in self.lines if e == name]

    def text(self) -> str:
        return json.dumps(self.lines, default=str)


def until(pred: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(port=free_port())
    try:
        yield r
    finally:
        r.stop()


class Rig:
    def __init__(self, state: Path, url: str, **notify: Any) -> None:
        self.state = state
        self.log = Log()
        self.cfg = NotifyConfig(**{"webhook_url": url, "timeout_s": 2, **notify})
        self.sender = WebhookSender(lambda: self.cfg, str(state), self.log, first_delay_s=0.2)

    def queued(self) -> list[str]:
        d = self.state / "webhook"
        return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


@pytest.fixture
def rigs(tmp_path: Path) -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for r in made:
        r.sender.stop()


def rig(rigs: list[Rig], tmp_path: Path, url: str, **notify: Any) -> Rig:
    r = Rig(tmp_path, url, **notify)
    rigs.append(r)
    return r


def doc(i: int) -> dict[str, Any]:
    return {"text": f"switch {i}", "event": "switch_finished", "n": i}


def test_documents_are_delivered_in_order_as_json_with_basic_auth(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    receiver.start()
    url = f"http://bot:s3cr%40t@127.0.0.1:{receiver.port}/hooks/T0KENPATH"
    r = rig(rigs, tmp_path, url)
    r.sender.start()
    for i in range(3):
        r.sender.enqueue(doc(i))
    assert [d["n"] for d in receiver.wait(3, 10)] == [0, 1, 2]
    post = receiver.posts[0]
    assert post.path == "/hooks/T0KENPATH"
    assert post.headers["Content-Type"] == "application/json"
    assert post.headers["Authorization"] == "Basic Ym90OnMzY3JAdA=="  # bot:s3cr@t
    assert post.body["text"] == "switch 0"
    until(lambda: r.queued() == [] and r.sender.status()["delivered"] == 3, "the queue to empty")
    st = r.sender.status()
    assert (st["delivered"], st["queued"], st["dropped"]) == (3, 0, 0)
    assert st["url"] == f"http://127.0.0.1:{receiver.port}/***"


def test_a_receiver_down_at_first_gets_the_document_when_it_comes_up_with_back_off(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    r = rig(rigs, tmp_path, receiver.url + "/in")
    r.sender.start()
    r.sender.enqueue(doc(1))
    until(lambda: len(r.log.events("webhook_retry")) >= 3, "three failed attempts")
    receiver.start()
    assert [d["n"] for d in receiver.wait(1, 15)] == [1]
    delays = [e["retry_in_s"] for e in r.log.events("webhook_retry")]
    assert delays[:3] == [0.2, 0.4, 0.8], delays  # doubling from the first delay
    assert all("no answer" in e["error"] for e in r.log.events("webhook_retry"))
    assert r.sender.status()["last_error"].startswith("no answer")


def test_5xx_and_429_are_retried_honouring_retry_after(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    receiver.script = [(503, {}), (429, {"Retry-After": "1"})]
    receiver.start()
    r = rig(rigs, tmp_path, receiver.url)
    r.sender.start()
    r.sender.enqueue(doc(7))
    assert [d["n"] for d in receiver.wait(1, 15)] == [7]
    statuses = [p.status for p in receiver.posts]
    assert statuses == [503, 429, 200]
    # The 429 said "Retry-After: 1": the next attempt waited for it (the back-off alone is 0.4 s).
    assert receiver.posts[2].at - receiver.posts[1].at >= 0.9
    assert [e["retry_in_s"] for e in r.log.events("webhook_retry")] == [0.2, 1.0]


def test_a_status_that_is_not_retried_drops_the_document_with_a_log_line(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    receiver.script = [(400, {})]
    receiver.start()
    r = rig(rigs, tmp_path, receiver.url)
    r.sender.start()
    r.sender.enqueue(doc(1))
    r.sender.enqueue(doc(2))
    assert [d["n"] for d in receiver.wait(1, 10)] == [2]
    assert [p.status for p in receiver.posts] == [400, 200]
    (dropped,) = r.log.events("webhook_dropped")
    assert "answered 400" in dropped["why"]
    assert r.sender.status()["dropped"] == 1


def test_a_restart_delivers_what_was_queued_in_order(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    first = rig(rigs, tmp_path, receiver.url)  # never started: the daemon died before delivering
    for i in range(4):
        first.sender.enqueue(doc(i))
    assert len(first.queued()) == 4
    receiver.start()
    second = rig(rigs, tmp_path, receiver.url)
    second.sender.start()
    assert [d["n"] for d in receiver.wait(4, 10)] == [0, 1, 2, 3]
    until(lambda: second.queued() == [], "the queue to empty")


def test_the_queue_is_bounded_the_oldest_dropped_with_a_log_line(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    r = rig(rigs, tmp_path, receiver.url, max_queued=2)
    for i in range(5):
        r.sender.enqueue(doc(i))
    assert len(r.queued()) == 2
    assert len(r.log.events("webhook_dropped")) == 3
    assert all("max_queued = 2" in e["why"] for e in r.log.events("webhook_dropped"))
    receiver.start()
    r.sender.start()
    assert [d["n"] for d in receiver.wait(2, 10)] == [3, 4]


def test_a_document_undelivered_for_a_day_is_dropped(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    r = rig(rigs, tmp_path, receiver.url)
    clock = [1_000_000.0]
    r.sender.now = lambda: clock[0]
    r.sender.enqueue(doc(1))
    clock[0] += 86401
    r.sender.enqueue(doc(2))
    receiver.start()
    r.sender.start()
    assert [d["n"] for d in receiver.wait(1, 10)] == [2]
    assert "undelivered for a day" in r.log.events("webhook_dropped")[0]["why"]


def test_no_log_line_or_status_shows_the_urls_credentials_or_path(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    receiver.script = [(500, {}), (404, {})]
    url = f"http://hookbot:PW-SECRET-1@127.0.0.1:{receiver.port}/hooks/PATH-TOKEN-2"
    r = rig(rigs, tmp_path, url)
    r.sender.start()
    r.sender.enqueue({"text": "x", "argv": ["--api-key", "KEY-SECRET-3"]})
    time.sleep(0.3)  # a few failed attempts while nothing listens
    receiver.start()
    until(lambda: r.log.events("webhook_dropped"), "the 404 to drop it")
    shown = r.log.text() + json.dumps(r.sender.status())
    for secret in ("hookbot", "PW-SECRET-1", "PATH-TOKEN-2"):
        assert secret not in shown, shown
    # The document itself was redacted before it was queued.
    assert "KEY-SECRET-3" not in json.dumps([p.body for p in receiver.posts])


def test_split_auth_moves_the_credentials_out_of_the_url() -> None:
    assert split_auth("https://a:b%2Fc@h.example:8443/p?q=1") == ("https://h.example:8443/p?q=1", "a:b/c")
    assert split_auth("http://[::1]:9/x") == ("http://[::1]:9/x", None)
    assert split_auth("http://u@[::1]:9/x") == ("http://[::1]:9/x", "u:")


# ------------------------------------------------------------ under attack (issue 20)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_nothing_reaches_the_other_origin_and_the_delivery_is_retried(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path, code: int
) -> None:
    other = Receiver(port=free_port()).start()  # the Location's origin: another local port
    try:
        receiver.script = [(code, {"Location": other.url + "/stolen/PATH-TOKEN"})]
        receiver.start()
        r = rig(rigs, tmp_path, f"http://bot:PW-SECRET@127.0.0.1:{receiver.port}/hooks/T0KEN")
        r.sender.start()
        r.sender.enqueue(doc(5))
        # The redirect was a failed delivery, retried (with the usual back-off) to the same URL.
        assert [d["n"] for d in receiver.wait(1, 15)] == [5]
        assert [(p.path, p.status) for p in receiver.posts] == [("/hooks/T0KEN", code), ("/hooks/T0KEN", 200)]
        assert all(p.headers["Authorization"] == "Basic Ym90OlBXLVNFQ1JFVA==" for p in receiver.posts)
        assert receiver.posts[1].at - receiver.posts[0].at >= 0.15  # first_delay_s = 0.2
        (retry,) = r.log.events("webhook_retry")
        assert retry["error"] == f"HTTP {code}: a redirect to http://127.0.0.1:{other.port}/***, not followed"
        assert retry["retry_in_s"] == 0.2
        # Nothing — no GET, no POST, no credential — ever reached the other origin.
        time.sleep(0.3)
        assert other.requests == [] and other.posts == []
        until(lambda: r.sender.status()["delivered"] == 1, "the delivery to count")
        st = r.sender.status()
        assert (st["delivered"], st["dropped"], st["queued"]) == (1, 0, 0)
        assert "redirect" in st["last_error"] and "PATH-TOKEN" not in r.log.text() + json.dumps(st)
    finally:
        other.stop()


def test_redirects_that_go_on_are_retried_with_back_off_and_reported(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path
) -> None:
    receiver.script = [(302, {"Location": "http://127.0.0.1:9/x"})] * 4
    receiver.start()
    r = rig(rigs, tmp_path, receiver.url)
    r.sender.start()
    r.sender.enqueue(doc(1))
    assert [d["n"] for d in receiver.wait(1, 20)] == [1]
    assert [p.status for p in receiver.posts] == [302] * 4 + [200]
    assert [e["retry_in_s"] for e in r.log.events("webhook_retry")] == [0.2, 0.4, 0.8, 1.6]
    assert r.sender.status()["last_error"] == "HTTP 302: a redirect to http://127.0.0.1:9/***, not followed"


def test_a_receiver_that_trickles_its_headers_is_cut_off_at_timeout_s_and_the_post_counts_as_failed(
    rigs: list[Rig], tmp_path: Path
) -> None:
    timeout_s = 5  # each header line comes 2 s after the last: a per-read timeout never fires
    slow = Trickler(port=free_port(), interval_s=2.0).start()
    try:
        r = rig(rigs, tmp_path, slow.url + "/in", timeout_s=timeout_s)
        r.sender.start()
        r.sender.enqueue(doc(1))
        bound = 3 * timeout_s
        until(lambda: r.log.events("webhook_retry"), "the POST to end as a failure", timeout_s=bound)
        (first, *_) = r.log.events("webhook_retry")
        assert first["error"] == f"no answer: no complete answer within timeout_s = {timeout_s} s"
        until(lambda: slow.ended and slow.ended[0] is not None, "the sender to close the connection")
        assert slow.ended[0] is not None and slow.ended[0] < bound
        st = r.sender.status()
        assert st["delivered"] == 0 and st["queued"] == 1 and st["last_error"].startswith("no answer")
    finally:
        slow.stop()


def _entry(n: int, **over: Any) -> dict[str, Any]:
    return {"queued_at": time.time(), "attempts": 0, "next_at": 0.0, "doc": doc(n), **over}


#: A bad queue file of each kind: (make it at ``path``, a phrase of the reason it is set aside for).
BAD_FILES: dict[str, tuple[Any, str]] = {
    "not JSON": (lambda p, o: p.write_bytes(b'{"doc": {"n": 1'), "not JSON"),
    "a JSON list": (lambda p, o: p.write_text("[1, 2]"), "a JSON list, not an object"),
    "no doc": (lambda p, o: p.write_text(json.dumps({"queued_at": 1.0, "attempts": 0})), "no document"),
    "doc not an object": (lambda p, o: p.write_text(json.dumps(_entry(0, doc="x"))), "no document"),
    "attempts a string": (lambda p, o: p.write_text(json.dumps(_entry(0, attempts="1"))), "'attempts'"),
    "next_at NaN": (lambda p, o: p.write_text(json.dumps(_entry(0, next_at=float("nan")))), "'next_at'"),
    "a FIFO": (lambda p, o: os.mkfifo(p), "not a regular file (FIFO)"),
    "a symlink": (lambda p, o: p.symlink_to(o), "a symbolic link (not followed)"),
    "a symlink to /dev/null": (lambda p, o: p.symlink_to("/dev/null"), "a symbolic link"),
    "a directory": (
        lambda p, o: (p.mkdir(), (p / "inside").write_text("x")),
        "not a regular file (directory)",
    ),
    "too large": (
        lambda p, o: p.write_text(json.dumps(_entry(0, doc={"pad": "x" * webhook.MAX_FILE_BYTES}))),
        f"larger than {webhook.MAX_FILE_BYTES} bytes",
    ),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_queue_file_is_set_aside_and_reported_and_the_next_document_is_delivered(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path, kind: str
) -> None:
    make, phrase = BAD_FILES[kind]
    state = tmp_path / "state"
    queue = state / "webhook"
    queue.mkdir(parents=True)
    outside = tmp_path / "outside.json"  # a symlink's target: a valid entry, never to be read
    outside.write_text(json.dumps(_entry(99)))
    bad = queue / "00000000000000000001-000000.json"  # older than anything enqueue names
    make(bad, outside)
    receiver.start()
    r = rig(rigs, state, receiver.url)
    r.sender.enqueue(doc(1))
    r.sender.start()
    assert [d["n"] for d in receiver.wait(1, 10)] == [1]
    until(
        lambda: r.queued() == ["bad"] and r.sender.status()["delivered"] == 1, "the queue to hold only bad/"
    )
    (event,) = r.log.events("webhook_file_set_aside")
    assert event["file"] == str(bad) and phrase in event["why"], event
    moved = sorted(p.name for p in (queue / "bad").iterdir())
    assert len(moved) == 2 and moved[0].endswith("-" + bad.name) and moved[1] == moved[0] + ".why", moved
    assert event["moved_to"] == str(queue / "bad" / moved[0])
    assert json.loads((queue / "bad" / moved[1]).read_text())["why"] == event["why"]
    st = r.sender.status()
    assert (st["set_aside"], st["delivered"], st["queued"]) == (1, 1, 0)
    assert st["last_error"] == f"queue file {bad.name} set aside: {event['why']}"
    assert st["last_set_aside"]["file"] == str(bad) and st["last_set_aside"]["why"] == event["why"]
    assert outside.exists() and [p.body["n"] for p in receiver.posts] == [1]


def test_the_files_set_aside_are_bounded_the_oldest_removed(
    receiver: Receiver, rigs: list[Rig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook, "MAX_SET_ASIDE", 3)
    queue = tmp_path / "webhook"
    queue.mkdir()
    for i in range(5):
        (queue / f"0000000000000000000{i}-000000.json").write_text(f"not json {i}")
    receiver.start()
    r = rig(rigs, tmp_path, receiver.url)
    r.sender.enqueue(doc(1))
    r.sender.start()
    assert [d["n"] for d in receiver.wait(1, 10)] == [1]
    until(lambda: r.sender.status()["set_aside"] == 5, "five files set aside")
    kept = sorted(p.name for p in (queue / "bad").iterdir() if not p.name.endswith(".why"))
    assert [n[-len("00000000000000000002-000000.json") :] for n in kept] == [
        f"0000000000000000000{i}-000000.json" for i in (2, 3, 4)
    ]
    assert len(list((queue / "bad").iterdir())) == 6  # each with its .why
