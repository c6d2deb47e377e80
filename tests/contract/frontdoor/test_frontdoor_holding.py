"""Requests through a switch, against real sockets: held with no status line until the release
forwards them to the new backend; after a rollback only those whose model what serves serves; a
hold that lasts hold_timeout_s and one beyond max_held are 503s with Retry-After; Close() counts
what is in flight and nothing new goes there; a switch that ends without a Close lets its held
requests go; the answers for a model not served now, off, unknown; the daemon lost."""

from __future__ import annotations

import json

from gpushift.frontdoor import state
from tests.support.frontdoor_rig import DAY, NIGHT, Door, answer, nothing_yet, send, wait_for


def held(door: Door) -> int:
    return int(door.loop.call(lambda: door.fd.status()["held"]))


def switching(door: Door, target: str = "night") -> None:
    door.update(active="day", switching=True, target=target, phase="drain")


def test_held_through_the_switch_then_forwarded_to_the_new_backend(door_factory) -> None:
    door = door_factory()
    switching(door)
    night = send(door, "POST", "/v1/chat/completions", {"model": NIGHT, "stream": True, "chunks": 2})
    nomodel = send(door, "POST", "/v1/embeddings", {"input": "x"})
    wait_for(lambda: held(door) == 2, "two requests held")
    assert nothing_yet(night) and nothing_yet(nomodel)  # no status line, no header
    assert door.loop.run(door.fd.close("day")) == 0
    day = send(door, "POST", "/v1/completions", {"model": DAY})  # the old backend's model, now closed
    status, headers, body = answer(day)
    assert status == 503 and "now switching to night" in json.loads(body)["error"]["message"]
    count, longest = door.loop.run(door.fd.release("night"))
    assert count == 2 and longest > 0.25
    status, headers, body = answer(night)
    assert status == 200 and b"night-0" in body and b"data: [DONE]" in body
    status, _, body = answer(nomodel)
    assert status == 200 and json.loads(body)["backend"] == "night"
    assert not [s for s in door.day.seen if s.path.startswith("/v1/chat")]
    st = door.loop.call(door.fd.status)
    assert st["held"] == 0 and st["closed"] == [] and st["in_flight"] == {"day": 0, "night": 0}


def test_after_a_rollback_only_what_the_old_backend_serves_goes_through(door_factory) -> None:
    door = door_factory()
    switching(door)
    door.loop.run(door.fd.close("day"))
    night = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    any_model = send(door, "POST", "/v1/chat/completions", {"messages": []})
    wait_for(lambda: held(door) == 2, "two requests held")
    assert door.loop.run(door.fd.release("day"))[0] == 2  # the switch rolled back
    status, headers, body = answer(night)
    err = json.loads(body)["error"]
    assert status == 503 and err["message"].startswith("the switch to night did not complete: ")
    assert "now serving: day" in err["message"]
    status, _, body = answer(any_model)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "from day"


def test_a_hold_lasts_hold_timeout_s_then_503_with_retry_after(door_factory) -> None:
    door = door_factory(hold_timeout_s=1)
    switching(door)
    c = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    wait_for(lambda: held(door) == 1, "held")
    status, headers, body = answer(c)
    err = json.loads(body)["error"]
    assert status == 503 and err["code"] == "hold_timeout" and "held 1 s" in err["message"]
    assert 1 <= int(headers["Retry-After"]) <= 300  # what is left of night's start_timeout_s
    assert held(door) == 0


def test_beyond_max_held_a_503_at_once(door_factory) -> None:
    door = door_factory(max_held=1)
    switching(door)
    first = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    wait_for(lambda: held(door) == 1, "held")
    status, headers, body = answer(send(door, "POST", "/v1/chat/completions", {"model": NIGHT}))
    assert status == 503 and json.loads(body)["error"]["code"] == "too_many_held"
    assert int(headers["Retry-After"]) >= 1
    door.loop.run(door.fd.release("night"))
    assert answer(first)[0] == 200


def test_close_counts_in_flight_and_a_client_gone_ends_it(door_factory) -> None:
    door = door_factory()
    status, _, body = answer(send(door, "GET", "/v1/../slow"))  # a way out of /v1/: refused
    assert status == 400 and not door.day.seen
    c = send(door, "POST", "/v1/chat/completions", {"model": DAY, "stream": True, "gate": True})
    wait_for(lambda: door.day.seen, "the backend got the request")
    switching(door)
    assert door.loop.run(door.fd.close("day")) == 1
    assert door.loop.call(lambda: door.fd.in_flight("day")) == 1
    c.close()  # the client goes away mid-stream
    wait_for(door.day.client_gone.is_set, "the backend saw its client gone")
    wait_for(lambda: door.loop.call(lambda: door.fd.in_flight("day")) == 0, "in flight back to 0")


def test_a_client_gone_before_the_backend_answered_aborts_the_backends_request(door_factory) -> None:
    door = door_factory()
    c = send(door, "POST", "/v1/slow", {"model": DAY})  # the backend takes an hour to answer
    wait_for(lambda: [s for s in door.day.seen if s.path == "/v1/slow"], "the backend got the request")
    assert door.loop.call(lambda: door.fd.in_flight("day")) == 1
    c.close()
    wait_for(door.day.client_gone.is_set, "the backend saw its client gone")
    wait_for(lambda: door.loop.call(lambda: door.fd.in_flight("day")) == 0, "in flight back to 0")


def test_a_switch_that_ends_without_close_lets_its_held_requests_go(door_factory) -> None:
    door = door_factory()
    switching(door)  # e.g. refused at preflight: no Close, no Release
    c = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    n = send(door, "POST", "/v1/chat/completions", {"model": DAY})  # the old backend, not closed: forwarded
    assert answer(n)[0] == 200
    wait_for(lambda: held(door) == 1, "held")
    door.update(active="day")
    status, _, body = answer(c)
    assert status == 503 and "now serving: day" in json.loads(body)["error"]["message"]


def test_a_missed_release_is_released_by_itself(door_factory, monkeypatch) -> None:
    monkeypatch.setattr(state, "RELEASE_GRACE_S", 0.3)
    door = door_factory()
    switching(door)
    door.loop.run(door.fd.close("day"))
    c = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    wait_for(lambda: held(door) == 1, "held")
    door.update(active="night")  # the switch ended, the daemon died before Release
    status, _, body = answer(c)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "from night"
    wait_for(lambda: door.loop.call(door.fd.status)["closed"] == [], "released by itself")


NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC, 09:00 CET


def test_not_served_now_says_when_with_retry_after_from_next_served(door_factory) -> None:
    door = door_factory(clock=lambda: NOW)
    door.update(
        active="night", zone="Europe/Berlin", mode="schedule", next_served={DAY: int(NOW) + 3600, NIGHT: 0}
    )
    status, headers, body = answer(send(door, "POST", "/v1/chat/completions", {"model": DAY}))
    err = json.loads(body)["error"]
    assert status == 503 and headers["Retry-After"] == "3600" and headers["x-should-retry"] == "false"
    assert err["message"] == f"{DAY} is served from 10:00 CET; now serving: night"
    assert set(err) == {"message", "type", "param", "code"}
    door.update(active="off", zone="Europe/Berlin", next_served={DAY: int(NOW) + 60})
    status, headers, body = answer(send(door, "POST", "/v1/chat/completions", {"model": DAY}))
    assert status == 503 and headers["Retry-After"] == "60" and "x-should-retry" not in headers
    assert json.loads(body)["error"]["code"] == "host_off"
    status, _, body = answer(send(door, "POST", "/v1/chat/completions", {"model": "gpt-4"}))
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


def test_the_daemon_lost_keeps_the_last_backend_while_its_health_answers(door_factory) -> None:
    door = door_factory()
    door.update(connected=False)
    status, _, body = answer(send(door, "POST", "/v1/completions", {"model": DAY}))
    assert status == 200 and json.loads(body)["backend"] == "day"
    door.day.healthy = False

    def lost() -> bool:
        status, _, body = answer(send(door, "POST", "/v1/completions", {"model": DAY}))
        return status == 503 and json.loads(body)["error"]["code"] == "daemon_unavailable"

    wait_for(lost, "503 once the backend's health failed")
    assert door.loop.call(door.fd.status)["daemon"] == "lost"
    door.update(active="day")
    assert answer(send(door, "POST", "/v1/completions", {"model": DAY}))[0] == 200
