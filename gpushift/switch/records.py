"""Ledger rows for what happened without a switch of gpushift's own.

A change made with ``systemctl`` behind gpushift's back, a relaunch outside gpushift, a backend
that crashed or wedged: each gets a complete row (outcome, the unit's result and exit, the argv as
it runs and the version where a backend runs), so the ledger accounts for every launch.
"""

from __future__ import annotations

import uuid
from typing import Any

from gpushift.config.instances import members, view
from gpushift.config.schema import Config
from gpushift.errors import GpushiftError
from gpushift.ports import Ports
from gpushift.values import OFF, Outcome, SwitchRecord, Trigger


def _row(
    ports: Ports,
    version: str,
    trigger: Trigger,
    by: str,
    reason: str,
    was: str | None,
    now_to: str,
    prefix: str,
) -> SwitchRecord:
    now = ports.clock.now()
    return SwitchRecord(
        trigger=trigger.value,
        requested_by=by,
        reason=reason,
        from_backend=was,
        to_backend=now_to,
        started_at=now,
        finished_at=now,
        outcome=Outcome.OK.value,
        gpushift_version=version,
        ticket=f"{prefix}-" + uuid.uuid4().hex[:8],
    )


def _describe_launch(
    ports: Ports, config: Config, rec: SwitchRecord, backend: str, version: bool, unit: str | None = None
) -> None:
    """The unit (``unit``: this instance's), its command as written and as it runs, and
    (``version``) the backend's version."""
    b = config.backends.get(backend)
    if b is None:
        return
    b = next((view(b, i) for i in members(b) if i.unit == unit), b)
    st = ports.units.state(b.unit)
    rec.unit = b.unit
    rec.unit_path = st.fragment_path or None
    rec.argv_configured = list(st.exec_start)
    rec.argv_running = ports.host.cmdline(st.main_pid) if st.main_pid else []
    rec.systemd_result = st.result
    if version and st.main_pid:
        v = ports.probe.version(b.version_url, b.version_command, expect_cgroup=st.control_group)
        if v.foreign is not None:  # another process answered: its version is not the backend's
            rec.extra["foreign_answer"] = dict(v.foreign)
            rec.message = f"{backend}: version not recorded: {v.foreign.get('message', 'not the backend')}"
        else:
            rec.backend_version, rec.version_source = v.version, v.source


def evidence(ports: Ports, unit: str, lines: int) -> dict[str, Any]:
    """Why a unit is not serving, for its row: systemd's ``Result`` and how its main process
    ended, and the unit's last log lines from the journal (the journal may rotate before the
    admin reads the row)."""
    out: dict[str, Any] = {"unit": unit}
    try:
        st = ports.units.state(unit)
        out.update(result=st.result, exit=st.exit_description(), state=f"{st.active_state}/{st.sub_state}")
    except GpushiftError as e:
        out["unit_error"] = str(e)
    out["log"] = (
        ports.host.unit_log(unit, lines) if lines else {"source": "none", "lines": [], "error": "off"}
    )
    return out


def _write(ports: Ports, rec: SwitchRecord) -> SwitchRecord:
    rec.id = ports.ledger.begin(rec)
    ports.ledger.finish(rec)
    return rec


def external(ports: Ports, config: Config, version: str, was: str, now: str) -> SwitchRecord:
    """``was`` → ``now`` changed with systemctl: not undone before the next boundary."""
    reason = f"{was} -> {now} changed outside gpushift; not undone before the next boundary"
    rec = _row(ports, version, Trigger.EXTERNAL, "systemctl", reason, was, now, "external")
    _describe_launch(ports, config, rec, now, version=False)
    return _write(ports, rec)


def relaunch(ports: Ports, config: Config, version: str, backend: str, detail: str) -> SwitchRecord:
    """The serving backend was relaunched outside gpushift (``systemctl restart``)."""
    rec = _row(ports, version, Trigger.EXTERNAL, "systemctl", detail, backend, backend, "external")
    rec.extra["relaunch"] = True
    _describe_launch(ports, config, rec, backend, version=True)
    return _write(ports, rec)


def incident(
    ports: Ports,
    config: Config,
    version: str,
    outcome: Outcome,
    backend: str,
    detail: str,
    exit: str,
    unit: str | None = None,
    serving: bool = False,
) -> SwitchRecord:
    """The serving backend crashed (exited by itself) or wedged (health failing): outcome says which.
    ``unit``: the instance that did (a backend of several, issue 23); ``serving``: the backend
    still serves on its other instances (the row goes to it, not to ``off``)."""
    rec = _row(ports, version, Trigger.WATCH, "gpushift", detail, backend, OFF, "incident")
    rec.outcome = outcome.value
    rec.message = detail
    rec.extra["incident"] = {"outcome": outcome.value, "backend": backend, "exit": exit}
    try:
        _describe_launch(ports, config, rec, backend, version=False, unit=unit)
    except GpushiftError as e:  # systemd cannot be asked: the row still says what was seen
        rec.extra["incident"]["unit_error"] = str(e)
    if rec.systemd_result is not None:
        rec.extra["incident"]["unit_result"] = rec.systemd_result
    b = config.backends.get(backend)
    if unit is not None:
        rec.extra["incident"].update(unit=unit, serving=serving)
    if b is not None:
        rec.extra["evidence"] = evidence(ports, unit or b.unit, config.daemon.evidence_lines)
    rec.to_backend = backend if outcome is Outcome.UNHEALTHY or serving else OFF
    return _write(ports, rec)
