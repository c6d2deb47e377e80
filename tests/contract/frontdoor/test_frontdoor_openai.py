"""The official ``openai`` Python package as the client (a client nobody here wrote): streamed chat
completions through the front door, one held across a switch and answered by the new backend, and
the front door's errors read as that client reads them (status, message, Retry-After)."""

from __future__ import annotations

import threading

import openai  # pyproject's test extra: a missing one fails the collection, naming it
import pytest

from tests.support.frontdoor_rig import DAY, DEADLINE_S, NIGHT, Door, wait_for


def client(door: Door) -> openai.OpenAI:
    return openai.OpenAI(base_url=door.base + "/v1", api_key="sk-test-key", max_retries=0, timeout=DEADLINE_S)


def streamed(door: Door, model: str) -> str:
    stream = client(door).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True, extra_body={"chunks": 4}
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_the_openai_client_streams_through_the_front_door(door_factory) -> None:
    door = door_factory()
    assert streamed(door, DAY) == "day-0 day-1 day-2 day-3 "
    assert door.day.header(-1, "Authorization") == ["Bearer sk-test-key"]
    models = [m.id for m in client(door).models.list()]
    assert models == [DAY, "default"]


def test_the_openai_client_is_held_across_a_switch_and_answered_by_the_new_backend(door_factory) -> None:
    door = door_factory()
    door.update(active="day", switching=True, target="night", phase="drain")
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(streamed(door, NIGHT)))
    t.start()
    try:
        wait_for(lambda: door.loop.call(door.fd.status)["held"] == 1, "the client's request held")
        door.loop.run(door.fd.close("day"))
        door.loop.run(door.fd.release("night"))
        door.update(active="night")
    finally:
        t.join(DEADLINE_S)
    assert got == ["night-0 night-1 night-2 night-3 "]


def test_the_openai_client_reads_the_front_doors_errors(door_factory) -> None:
    now = 1_800_000_000.0
    door = door_factory(clock=lambda: now)
    door.update(active="night", zone="UTC", next_served={DAY: int(now) + 90})
    with pytest.raises(openai.APIStatusError) as e:
        client(door).chat.completions.create(model=DAY, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503
    assert e.value.response.headers["retry-after"] == "90"
    assert f"{DAY} is served from 08:01:30 UTC; now serving: night" in e.value.message
    with pytest.raises(openai.NotFoundError) as nf:
        client(door).chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert "does not exist here" in nf.value.message
