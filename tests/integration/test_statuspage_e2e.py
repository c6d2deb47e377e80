"""The status page, end to end: the real daemon (the shipped gpushift.service under a real systemd
user manager, stand-in backends, a schedule with a calendar exception), the real front door
(the shipped ``gpushift-frontdoor.socket`` and ``.service``, socket-activated in the sandbox's
manager: ``tests/support/frontdoor_sandbox.py``) on the sandbox's bus, and a real headless Chromium (Debian's
``chromium``, driven through the DevTools protocol: ``tests/support/chromium.py``) reading the
page it serves at ``/gpushift/``.

* The page's DOM names the backend serving; after ``gpushift switch`` it names the new one within
  5 s of the command's return (the page refreshes itself; nothing reloads it).
* The timeline's SVG has one ``g.stretch`` per stretch of the week, with the backend, the start
  and the end that ``gpushift schedule --week --json`` (its override read from the same daemon)
  gives, the override included.
* Neither the HTML (as Chromium holds it, and as served) nor ``status.json`` holds an argument
  of a configured backend's command line or an environment key or value of its unit (a value of
  three characters or fewer, or only digits, such as a port, is not looked for: a number on the
  page may equal it by chance; no field of the summary can carry one: ``test_summary.py``).
* The screenshot is kept: ``build/test-artifacts/statuspage.png`` (or ``$GPUSHIFT_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from gpushift_env import REPO, Backend, GpushiftEnv, free_port

from tests.support.chromium import Chromium
from tests.support.frontdoor_sandbox import SandboxFrontDoor

BERLIN = ZoneInfo("Europe/Berlin")
#: The acceptance's bound from a switch's end to the page showing it.
SHOWN_WITHIN_S = 5.0
DEADLINE_S = 60.0


def artifacts() -> Path:
    return Path(os.environ.get("GPUSHIFT_TEST_ARTIFACTS") or REPO / "build" / "test-artifacts")


def schedule_text(now: datetime) -> str:
    """Entries whose hours are far from now (no boundary fires during the test) and a calendar
    exception the day after tomorrow."""
    local = now.astimezone(BERLIN)
    h_a, h_b = (local.hour + 6) % 24, (local.hour + 15) % 24
    d = (local + timedelta(days=2)).date().isoformat()
    return f"TZ=Europe/Berlin\n0 {h_a} * * * a\n0 {h_b} * * * b\nexcept {d} 12:00 .. {d} 18:00 off maint\n"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=20) as r:
        return str(r.read().decode())


def unit_words(env: GpushiftEnv, b: Backend) -> list[str]:
    """Every argument of the unit's command line and every key and value of its environment."""
    show = env.sb.show(b.unit, "ExecStart", "Environment")
    argv = show["ExecStart"].split("argv[]=", 1)[1].split(" ;", 1)[0]
    words = shlex.split(argv)
    for assignment in shlex.split(show["Environment"]):
        key, _, value = assignment.partition("=")
        words += [key, value]
    return [w for w in words if len(w) > 3 and not w.isdigit()]


#: The virtualenv's interpreter may live under /root or /home (pyenv): ProtectHome=yes would hide it.
INTERPRETER_HOME = (
    ["# this checkout's interpreter lives under a home directory", "ProtectHome=read-only"]
    if os.path.realpath(sys.executable).startswith(("/root/", "/home/"))
    else []
)


def start_frontdoor(env: GpushiftEnv, port: int) -> SandboxFrontDoor:
    """The shipped front door units in the sandbox (socket-activated: ``frontdoor_sandbox.py``),
    serving the page once it has heard from the daemon."""
    door = SandboxFrontDoor(
        env.sb,
        env.config_path,
        [f"127.0.0.1:{port}"],
        environment=[f"DBUS_SESSION_BUS_ADDRESS={env.sb.bus_address}"],
        service_lines=[
            "# the config lives under /tmp, shared with the test (as the daemon's drop-in does)",
            "PrivateTmp=no",
            *INTERPRETER_HOME,
        ],
    ).install()
    door.start_socket()
    door.activate()
    end_at = time.monotonic() + DEADLINE_S
    while True:
        try:
            doc = json.loads(get(f"http://127.0.0.1:{port}/gpushift/status.json"))
            if doc.get("stale_since") is None and doc["serving"]["backend"] in ("a", "b"):
                return door
        except OSError:
            pass
        if time.monotonic() > end_at:
            raise AssertionError(f"the front door did not serve the page:\n{door.log()}")
        time.sleep(0.2)


SVG_STRETCHES = (
    "Array.from(document.querySelectorAll('#timeline g.stretch'))"
    ".map(g => [g.dataset.from, g.dataset.until, g.dataset.backend, g.dataset.source])"
)


def cli_stretches(env: GpushiftEnv) -> list[list[Any]]:
    doc = json.loads(env.cli("schedule", "--week", "--json", check=True).stdout)
    assert doc["override_from"] == "the daemon", doc["override_from"]
    return [[s["from_utc"], s["until_utc"], s["backend"], s["source"]] for s in doc["stretches"]]


def test_the_status_page_in_chromium_follows_a_switch_and_shows_no_secret(sandbox: Any) -> None:
    now = datetime.now(BERLIN)
    a = Backend(
        "a",
        free_port(),
        [0, 1],
        args=["--api-key", "s3cret-page-key"],
        environment={"HF_TOKEN": "hf_pagetok"},
    )
    b = Backend("b", free_port(), [1], environment={"OTHER_SECRET": "b-secret-value"})
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True, exist_ok=True)
    (base / "schedule").write_text(schedule_text(now))
    env = GpushiftEnv(sandbox, base, [a, b], schedule=str(base / "schedule"))
    port = free_port()
    env.install()
    env.write_config(env.config_text() + f'\n[frontdoor]\nlisten = ["127.0.0.1:{port}"]\n')
    env.start_daemon()
    env.wait_for(
        lambda: env.status().get("active") in ("a", "b"), DEADLINE_S, "the schedule's backend serving"
    )
    first = env.status()["active"]
    other = "b" if first == "a" else "a"

    start_frontdoor(env, port)  # its units stop with the sandbox
    browser = Chromium(base / "chromium")
    try:
        browser.start()
        page = browser.open(f"http://127.0.0.1:{port}/gpushift/")
        shown = "document.querySelector('#serving') && document.querySelector('#serving').dataset.backend"
        assert page.wait_for(shown) == first
        page.screenshot(artifacts() / "statuspage.png")

        # the week: one SVG group per stretch, as `schedule --week` lays it out
        svg = page.wait_for(SVG_STRETCHES)
        assert [s[:3] for s in svg] == [s[:3] for s in cli_stretches(env)]
        assert {"schedule", "exception"} <= {s[3] for s in svg}
        assert ["off", "exception"] in [[s[2], s[3]] for s in svg]  # maint, the day after tomorrow

        env.cli("switch", other, "--reason", "page test", check=True)
        switched = time.monotonic()
        assert page.wait_for(f"({shown}) === '{other}'", deadline_s=SHOWN_WITHIN_S * 4)
        took = time.monotonic() - switched
        assert took <= SHOWN_WITHIN_S, f"the page showed {other} {took:.1f} s after the switch"
        print(f"the page showed {other} {took:.2f} s after the switch returned")
        # the override the switch made reaches the SVG with the next summary
        page.wait_for(f"{SVG_STRETCHES}.some(s => s[2] === '{other}' && s[3] === 'override')")
        svg = page.evaluate(SVG_STRETCHES)
        assert [s[:4] for s in svg] == cli_stretches(env)
        page.screenshot(artifacts() / "statuspage-after-switch.png")

        texts = {
            "the DOM": page.evaluate("document.documentElement.outerHTML"),
            "the HTML served": get(f"http://127.0.0.1:{port}/gpushift/"),
            "status.json": get(f"http://127.0.0.1:{port}/gpushift/status.json"),
        }
        words = unit_words(env, a) + unit_words(env, b)
        assert {"s3cret-page-key", "--api-key", "HF_TOKEN", "hf_pagetok", "b-secret-value"} <= set(words)
        for name, text in texts.items():
            leaked = sorted({w for w in words if w in text})
            assert not leaked, f"{name} holds {leaked}"
        doc = json.loads(texts["status.json"])
        assert doc["serving"]["backend"] == other and doc["mode"] == "override"
        assert [r["to"] for r in doc["recent"]][:1] == [other]
    finally:
        browser.stop()
