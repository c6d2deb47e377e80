"""The webhook sender against a real local HTTP receiver (tests/support/receiver.py): delivery in
order, back-off while the receiver is down, Retry-After, statuses that are not retried, the queue
on disk across a restart, its bound, a day's limit, and no credential in any log line."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushift.config.hooks import NotifyConfig
from gpushift.notify.webhook import WebhookSender, split_auth
from tests.support.receiver import Receiver


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
        self.cfg = NotifyConfig(webhook_url=url, timeout_s=2, **notify)
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
