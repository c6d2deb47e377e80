"""Where a request goes (gpushift/frontdoor/routing.py): the decision table of issue 19 items 4
and 5 — served now, a switch in progress (held or answered at once), off, nothing serving, unknown
names, aliases, and the daemon lost — plus the sorting of held requests at a release."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpushift.frontdoor import routing
from gpushift.frontdoor.routing import ANSWER, FORWARD, HOLD, Decision, Names, Situation, names_of
from gpushift.frontdoor.view import DaemonView

DAY, NIGHT = "qwen2.5-7b-instruct", "llama-3.2-1b"
BACKENDS = frozenset({"vllm", "llama"})

#: vllm's names from the config; llama's from the daemon's Models (its config says None).
NAMES = names_of(
    {"vllm": (DAY, "both"), "llama": None},
    {"vllm": ("default",), "llama": ("default", "small")},
    {"llama": (NIGHT, "both"), "vllm": ("ignored-for-vllm",)},
)

SERVING_VLLM = DaemonView(connected=True, active="vllm")
SWITCHING = DaemonView(connected=True, active="vllm", switching=True, target="llama", phase="drain")


def sit(view: DaemonView, closed: tuple[str, ...] = (), fallback: str = "") -> Situation:
    return Situation(view, frozenset(closed), fallback, BACKENDS)


def test_names_come_from_the_config_else_from_the_daemons_models() -> None:
    assert NAMES.models == {"vllm": (DAY, "both"), "llama": (NIGHT, "both")}
    assert NAMES.owners("both") == ("vllm", "llama")
    assert NAMES.aliased("default") == ("vllm", "llama")
    assert NAMES.aliased("small") == ("llama",)
    assert not NAMES.known("ignored-for-vllm")
    assert NAMES.every_model() == [DAY, "both", NIGHT]
    # an alias reaches its backend under that backend's first model name
    assert NAMES.reaches("default", "llama") == (True, NIGHT)
    assert NAMES.reaches(DAY, "vllm") == (True, None)
    assert NAMES.reaches(DAY, "llama") == (False, None)


def test_a_backend_with_no_names_known_takes_an_alias_unchanged() -> None:
    names = names_of({"llama": None}, {"llama": ("default",)}, {})
    assert names.reaches("default", "llama") == (True, None)


F, H, A = FORWARD, HOLD, ANSWER


@pytest.mark.parametrize(
    ("why", "situation", "model", "expected"),
    [
        # served now
        ("its model", sit(SERVING_VLLM), DAY, Decision(F, "vllm")),
        ("no model: whatever serves", sit(SERVING_VLLM), None, Decision(F, "vllm")),
        ("a model both serve", sit(SERVING_VLLM), "both", Decision(F, "vllm")),
        ("an alias is rewritten", sit(SERVING_VLLM), "default", Decision(F, "vllm", DAY)),
        ("another backend's model", sit(SERVING_VLLM), NIGHT, Decision(A, "vllm", reason=routing.NOT_SERVED)),
        (
            "an alias of another backend only",
            sit(SERVING_VLLM),
            "small",
            Decision(A, "vllm", reason=routing.NOT_SERVED),
        ),
        ("unknown", sit(SERVING_VLLM), "gpt-4", Decision(A, "vllm", reason=routing.UNKNOWN_MODEL)),
        ("empty name is unknown", sit(SERVING_VLLM), "", Decision(A, "vllm", reason=routing.UNKNOWN_MODEL)),
        # off, nothing serving
        ("off", sit(replace(SERVING_VLLM, active="off")), DAY, Decision(A, reason=routing.HOST_OFF)),
        (
            "off, no model",
            sit(replace(SERVING_VLLM, active="off")),
            None,
            Decision(A, reason=routing.HOST_OFF),
        ),
        (
            "off, unknown is still 404",
            sit(replace(SERVING_VLLM, active="off")),
            "x",
            Decision(A, reason=routing.UNKNOWN_MODEL),
        ),
        (
            "nothing known",
            sit(replace(SERVING_VLLM, active="")),
            DAY,
            Decision(A, reason=routing.NOTHING_SERVING),
        ),
        (
            "an unconfigured name",
            sit(replace(SERVING_VLLM, active="ghost")),
            None,
            Decision(A, reason=routing.NOTHING_SERVING),
        ),
        # a switch in progress, vllm → llama
        ("the target's model is held", sit(SWITCHING), NIGHT, Decision(H, "llama")),
        ("no model is held", sit(SWITCHING), None, Decision(H, "llama")),
        ("an alias the target takes is held", sit(SWITCHING), "default", Decision(H, "llama")),
        ("a model both serve is held", sit(SWITCHING), "both", Decision(H, "llama")),
        ("old model, old not closed yet: forwarded", sit(SWITCHING), DAY, Decision(F, "vllm")),
        (
            "old model, old closed: answered",
            sit(SWITCHING, ("vllm",)),
            DAY,
            Decision(A, "vllm", reason=routing.NOT_SERVED, target="llama"),
        ),
        ("closed, not yet switching: held", sit(SERVING_VLLM, ("vllm",)), DAY, Decision(H, "")),
        (
            "closed, target unknown: held",
            sit(replace(SWITCHING, target=""), ("vllm",)),
            NIGHT,
            Decision(H, ""),
        ),
        (
            "switching to off: answered",
            sit(replace(SWITCHING, target="off"), ("vllm",)),
            NIGHT,
            Decision(A, "vllm", reason=routing.HOST_OFF, target="off"),
        ),
        ("switching to off, old still open", sit(replace(SWITCHING, target="off")), DAY, Decision(F, "vllm")),
        (
            "switching, unknown is 404",
            sit(SWITCHING),
            "gpt-4",
            Decision(A, "vllm", reason=routing.UNKNOWN_MODEL),
        ),
        ("from off: held", sit(replace(SWITCHING, active="off")), NIGHT, Decision(H, "llama")),
        (
            "from off, other model: answered",
            sit(replace(SWITCHING, active="off")),
            DAY,
            Decision(A, "", reason=routing.NOT_SERVED, target="llama"),
        ),
        # the daemon lost
        ("lost, nothing known", sit(DaemonView()), DAY, Decision(A, reason=routing.DAEMON_LOST)),
        ("lost, fallback serves it", sit(DaemonView(), fallback="vllm"), DAY, Decision(F, "vllm")),
        ("lost, fallback, no model", sit(DaemonView(), fallback="vllm"), None, Decision(F, "vllm")),
        (
            "lost, fallback, other model",
            sit(DaemonView(), fallback="vllm"),
            NIGHT,
            Decision(A, "vllm", reason=routing.NOT_SERVED),
        ),
        ("lost mid-switch (closed): held", sit(DaemonView(), ("vllm",), "vllm"), DAY, Decision(H, "")),
        (
            "lost: a stale switching flag is not a switch",
            sit(replace(SWITCHING, connected=False), fallback="vllm"),
            DAY,
            Decision(F, "vllm"),
        ),
    ],
)
def test_route(why: str, situation: Situation, model: str | None, expected: Decision) -> None:
    assert routing.route(NAMES, situation, model) == expected, why


@pytest.mark.parametrize(
    ("serving", "model", "expected"),
    [
        ("llama", NIGHT, Decision(F, "llama")),
        ("llama", None, Decision(F, "llama")),
        ("llama", "default", Decision(F, "llama", NIGHT)),
        ("vllm", NIGHT, Decision(A, "vllm", reason=routing.NOT_SERVED)),  # rolled back
        ("vllm", None, Decision(F, "vllm")),
        ("off", NIGHT, Decision(A, reason=routing.HOST_OFF)),
        ("", NIGHT, Decision(A, reason=routing.NOTHING_SERVING)),
    ],
)
def test_after_release(serving: str, model: str | None, expected: Decision) -> None:
    assert routing.after_release(NAMES, serving, model, BACKENDS) == expected


def test_names_table_is_empty_for_no_backends() -> None:
    n = Names.of({}, {})
    assert not n.known("x") and n.every_model() == []
