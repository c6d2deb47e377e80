"""What the front door says when it answers a request itself: OpenAI-format errors.

Pure.  Every answer is ``{"error": {"message", "type", "param", "code"}}`` (the format the
official clients parse), with, for a model that comes back at a known time, ``Retry-After`` in
whole seconds rounded up from the daemon's ``NextServed`` and a message naming that time in the
schedule's zone ("qwen2.5-7b-instruct is served from 08:00 CET; now serving: llama").  A wait
over :data:`CLIENT_RETRY_MAX_S` also sends ``x-should-retry: false``: the official Python client
retries by itself on a 503, and should not sit in a retry loop for minutes.  During a hold, when
no time is known, there is no ``Retry-After`` and the message says the GPU is held until a person
resumes the schedule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpushift.config.validate import shown
from gpushift.frontdoor import routing
from gpushift.frontdoor.routing import Names
from gpushift.frontdoor.view import DaemonView
from gpushift.schedule.zones import ZONE_KEY
from gpushift.values import Mode

#: Beyond this wait (seconds) a 503 also says ``x-should-retry: false``.
CLIENT_RETRY_MAX_S = 120

#: Retry-After when no time is known but the wait should be short (the daemon restarting, ...).
SHORT_RETRY_S = 5

# The error types ("type") and codes ("code") of our answers.
INVALID_REQUEST = "invalid_request_error"
UNAVAILABLE = "service_unavailable"
SERVER_ERROR = "server_error"

#: How many model names a 404 lists.
LISTED_MAX = 20


@dataclass(frozen=True)
class Answer:
    """An error answer: the status, the OpenAI-format body's fields, and the retry headers."""

    status: int
    message: str
    code: str
    type: str = UNAVAILABLE
    param: str | None = None
    retry_after: int | None = None  # seconds; None: no Retry-After
    should_retry: bool | None = None  # False: x-should-retry: false; None: no such header

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode()

    def headers(self) -> list[tuple[str, str]]:
        out = [("Content-Type", "application/json")]
        if self.retry_after is not None:
            out.append(("Retry-After", str(self.retry_after)))
        if self.should_retry is not None:
            out.append(("x-should-retry", "true" if self.should_retry else "false"))
        return out


def zone_of(name: str) -> tzinfo:
    """The schedule's zone (``TimeZone``; "" or a name the zone database lacks: UTC)."""
    if name and ZONE_KEY.fullmatch(name):
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    return timezone.utc


def when(at: float, now: float, zone: str) -> str:
    """``at`` (UTC seconds) for a message, in the schedule's zone: ``08:00 CET`` today,
    ``Tue 08:00 CET`` within the week, else ``2026-12-24 08:00 CET``."""
    tz = zone_of(zone)
    t = datetime.fromtimestamp(at, tz)
    today = datetime.fromtimestamp(now, tz).date()
    clock = t.strftime("%H:%M" if t.second == 0 else "%H:%M:%S")
    name = t.tzname() or "UTC"
    days = (t.date() - today).days
    if days == 0:
        return f"{clock} {name}"
    if 0 < days < 7:
        return f"{t.strftime('%a')} {clock} {name}"
    return f"{t.date().isoformat()} {clock} {name}"


def next_at(names: Names, view: DaemonView, model: str | None) -> int | None:
    """When ``model`` is next served (UTC seconds; 0: now), from ``NextServed``: an alias comes
    back with the first of its backends' models, no model with the first model of all; None: never
    (or not known)."""
    ns = view.next_served
    if model is not None and model in ns:
        return ns[model]
    if model is None:
        pool: Iterable[str] = ns
    elif names.aliased(model):
        pool = [m for b in names.aliased(model) for m in names.models.get(b, ())]
    else:
        return None
    times = [ns[m] for m in pool if m in ns]
    return min(times) if times else None


def _model_text(model: str | None) -> str:
    return "a request naming no model" if model is None else shown(model, 80).strip("'\"")


def _comes_back(model: str | None, at: int | None, now: float, view: DaemonView) -> tuple[str, int | None]:
    """The sentence saying when ``model`` is served again, and the Retry-After (None: none)."""
    what = "the next model" if model is None else _model_text(model)
    if at is None:
        if view.mode == Mode.HOLD:
            return f"{what} is not served while the GPU is held, until a person resumes the schedule", None
        if view.mode == Mode.MANUAL:
            return f"{what} is not scheduled (no schedule): a person switches with 'gpushift switch'", None
        return f"{what} is not scheduled to be served again", None
    wait = math.ceil(at - now)
    if wait <= 0:
        return f"{what} is being brought up now", 1
    return f"{what} is served from {when(at, now, view.zone)}", wait


def _unavailable(code: str, message: str, retry_after: int | None) -> Answer:
    no_retry = retry_after is None or retry_after > CLIENT_RETRY_MAX_S
    return Answer(503, message, code, retry_after=retry_after, should_retry=False if no_retry else None)


def for_decision(
    d: routing.Decision, names: Names, view: DaemonView, model: str | None, now: float
) -> Answer:
    """The answer for a routing decision of action ``answer``."""
    if d.reason == routing.UNKNOWN_MODEL:
        return unknown_model(names, model)
    if d.reason == routing.DAEMON_LOST:
        return _unavailable(
            "daemon_unavailable",
            "the gpushift daemon is not answering and no backend is known to be serving",
            SHORT_RETRY_S,
        )
    sentence, retry = _comes_back(model, next_at(names, view, model), now, view)
    serving = d.backend or "nothing"
    if d.reason == routing.HOST_OFF:
        going = "is going off" if d.target else "is off"
        return _unavailable("host_off", f"the GPU host {going}; {sentence}", retry)
    if d.reason == routing.NOTHING_SERVING:
        return _unavailable(
            "nothing_serving",
            f"no backend is serving now; {sentence}",
            SHORT_RETRY_S if retry is None else retry,
        )
    if d.target:
        sentence += f"; now switching to {d.target}, which does not serve it"
    return _unavailable("model_not_served", f"{sentence}; now serving: {serving}", retry)


def unknown_model(names: Names, model: str | None) -> Answer:
    every = sorted({*names.every_model(), *(a for al in names.aliases.values() for a in al)})
    listed = ", ".join(every[:LISTED_MAX]) + (", ..." if len(every) > LISTED_MAX else "")
    return Answer(
        404,
        f"the model {shown(model, 80)} does not exist here; the models are: {listed or 'none'}",
        "model_not_found",
        INVALID_REQUEST,
        "model",
    )


def released_elsewhere(
    d: routing.Decision, names: Names, view: DaemonView, model: str | None, now: float, target: str
) -> Answer:
    """A held request whose model what serves after the switch does not serve (a rollback)."""
    base = for_decision(d, names, view, model, now)
    why = f"the switch to {target} did not complete" if target else "the switch ended"
    return Answer(
        base.status,
        f"{why}: {base.message}",
        base.code,
        base.type,
        base.param,
        base.retry_after,
        base.should_retry,
    )


def hold_timeout(held_s: float, target: str, estimate_s: float) -> Answer:
    wait = max(1, math.ceil(estimate_s))
    to = f" to {target}" if target else ""
    return _unavailable(
        "hold_timeout",
        f"the request was held {held_s:.0f} s (hold_timeout_s) through the switch{to}, which has not ended yet",
        wait,
    )


def too_many_held(max_held: int, target: str, estimate_s: float) -> Answer:
    to = f" to {target}" if target else ""
    return _unavailable(
        "too_many_held",
        f"{max_held} requests are held already (max_held) while the GPU switches{to}",
        max(1, math.ceil(estimate_s)),
    )


def bad_request(message: str, code: str, param: str | None = None) -> Answer:
    return Answer(400, message, code, INVALID_REQUEST, param)


def bad_http(status: int, why: str) -> Answer:
    """A request that is not HTTP the front door can read (a head too large, TLS on the plain port)."""
    return Answer(status, f"the request could not be read: {why}", "bad_request", INVALID_REQUEST)


def not_a_string(value: Any) -> Answer:
    return bad_request(
        f"'model' must be a string, got {type(value).__name__} {shown(value)}", "invalid_model", "model"
    )


def too_large(limit: int) -> Answer:
    return Answer(
        413, f"the request body is over {limit} bytes (max_body_bytes)", "request_too_large", INVALID_REQUEST
    )


def timed_out(what: str, limit_s: float) -> Answer:
    return Answer(
        408, f"the request's {what} did not arrive within {limit_s:g} s", "request_timeout", INVALID_REQUEST
    )


def no_route(path: str, native: Iterable[str]) -> Answer:
    extra = ", ".join(sorted(native))
    return Answer(
        404,
        f"{shown(path, 80)} is not forwarded here: the OpenAI routes (/v1/...)"
        + (f" and {extra}" if extra else ""),
        "not_found",
        INVALID_REQUEST,
    )


def bad_method(method: str) -> Answer:
    return Answer(405, f"method {shown(method)} is not forwarded", "method_not_allowed", INVALID_REQUEST)


def upstream_failed(backend: str, why: str) -> Answer:
    return Answer(
        502, f"backend {backend} did not answer: {why}", "upstream_error", SERVER_ERROR, None, SHORT_RETRY_S
    )


def internal(why: str) -> Answer:
    return Answer(500, f"the front door failed on this request: {why}", "internal_error", SERVER_ERROR)


def models_list(names: Names, view: DaemonView, serving: str, backends: Mapping[str, str]) -> dict[str, Any]:
    """``GET /v1/models``: the models served now, each with a ``gpushift`` extension (its
    backend, when next served), and every configured model in the top-level ``gpushift`` field.

    Args:
        serving: the backend serving now ("" none).
        backends: backend name → its kind (for the extension).
    """

    def entry(model: str, backend: str) -> dict[str, Any]:
        return {
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "gpushift",
            "gpushift": {
                "backend": backend,
                "kind": backends.get(backend, ""),
                "served": backend == serving,
                "next_served": view.next_served.get(model),
            },
        }

    served = [entry(m, serving) for m in names.models.get(serving, ())]
    served += [entry(a, serving) for a in names.aliases.get(serving, ()) if names.models.get(serving)]
    every = [entry(m, b) for b, ms in names.models.items() for m in ms]
    return {
        "object": "list",
        "data": served,
        "gpushift": {
            "serving": serving or None,
            "switching": bool(view.switching),
            "target": view.target or None,
            "models": every,
        },
    }
