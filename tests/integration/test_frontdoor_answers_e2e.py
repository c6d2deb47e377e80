"""What the front door tells a client whose model is not served, against the real daemon's schedule.

The schedule (``TZ=Europe/Berlin``: day at 08:00, night at 20:00) has a calendar exception in the
way: ``day`` from today through the day of the next 20:00, so that night is not served at its
next 20:00 but when the exception ends, at midnight after it.  Through the socket-activated front
door:

* a request for ``night-model`` gets a 503 whose ``Retry-After`` matches the daemon's
  ``NextServed`` for it (within 2 s) and the schedule (the exception's end, not the silenced
  20:00), with ``x-should-retry: false`` (hours away) and a message naming that time in Berlin;
* a model no backend serves gets a 404 in the same format;
* with the host switched ``off``, a request for ``day-model`` gets a 503 with the ``NextServed`` of
  it, and says that the host is off.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from frontdoor_env import DAY, NIGHT, DoorEnv, error_of, post, standin_backend

BERLIN = ZoneInfo("Europe/Berlin")


def _schedule(now: datetime) -> tuple[str, datetime]:
    """The schedule text, and when night is next served by it (the exception's end)."""
    local = now.astimezone(BERLIN)
    night = local.replace(hour=20, minute=0, second=0, microsecond=0)
    if night <= local:
        night += timedelta(days=1)
    first, last = local.date(), night.date()
    end = datetime(last.year, last.month, last.day, tzinfo=BERLIN) + timedelta(days=1)
    text = (
        "TZ=Europe/Berlin\n"
        "0 8 * * * day\n"
        "0 20 * * * night\n"
        f"except {first.isoformat()} .. {last.isoformat()} day trip\n"
    )
    return text, end


def _next_served(env: DoorEnv) -> dict[str, int]:
    """The daemon's NextServed property, as busctl prints it: ``a{st} 2 "day-model" 0 ...``."""
    text = env.property("NextServed")
    return {m: int(t) for m, t in re.findall(r'"([^"]+)" (\d+)', text)}


def test_retry_after_says_when_the_schedule_serves_the_model_and_unknown_is_404_and_off_is_503(
    sandbox: Any,
) -> None:
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True)
    text, night_at = _schedule(datetime.now(tz=BERLIN))
    (base / "schedule").write_text(text)
    day, night = standin_backend("day", DAY), standin_backend("night", NIGHT)
    env = DoorEnv(sandbox, base, [day, night], schedule=str(base / "schedule"), sample_interval_s=0.5).up()
    env.wait_serving("day")  # the exception is in force: day, whatever the hour
    env.door.activate()
    served = _next_served(env)
    assert served.get(NIGHT) == int(night_at.timestamp()), (served, night_at, text)
    assert served.get(DAY) == 0

    status, headers, raw = post(env.url("/v1/chat/completions"), {"model": NIGHT, "messages": []})
    now = time.time()
    assert status == 503, raw
    err = error_of(raw)
    assert err["code"] == "model_not_served", err
    assert abs(int(headers["retry-after"]) - (served[NIGHT] - now)) <= 2, (headers, served, now)
    assert headers["x-should-retry"] == "false"
    clock = night_at.strftime("%H:%M %Z")  # "00:00 CET" (or CEST)
    assert clock in err["message"] and "now serving: day" in err["message"], err

    status, headers, raw = post(env.url("/v1/completions"), {"model": "gpt-nonesuch", "prompt": "x"})
    assert status == 404, raw
    err = error_of(raw)
    assert err["code"] == "model_not_found" and "gpt-nonesuch" in err["message"], err
    assert DAY in err["message"] and NIGHT in err["message"]
    assert "retry-after" not in headers

    env.cli("switch", "off", "--reason", "front door e2e", check=True)
    env.wait_serving("off")
    served = _next_served(env)
    status, headers, raw = post(env.url("/v1/chat/completions"), {"model": DAY, "messages": []})
    now = time.time()
    assert status == 503, raw
    err = error_of(raw)
    assert err["code"] == "host_off" and "off" in err["message"], err
    if DAY in served:
        assert abs(int(headers["retry-after"]) - (served[DAY] - now)) <= 2, (headers, served)
    else:
        assert "retry-after" not in headers, (headers, served)
    status, headers, raw = post(env.url("/v1/chat/completions"), {"model": NIGHT, "messages": []})
    assert status == 503 and error_of(raw)["code"] == "host_off", raw
