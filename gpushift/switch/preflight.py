"""The preflight of a switch — everything checked before anything is touched.

What runs is asked of systemd now; the target's unit must be loaded; the doctor's rules
(``gpushift check``) must raise no error; and the GPUs the switch will gate on must not hold
memory that the backends being stopped do not account for (another user's job would keep the gate
closed after the current backend was already stopped).  A refusal is recorded in the ledger with
outcome ``refused``; nothing was touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpushift.config.instances import units_of
from gpushift.config.schema import Config
from gpushift.doctor.identity import identity_problems
from gpushift.errors import GpushiftError, VramNotReleased
from gpushift.switch.policy import foreign_memory, gate_gpus
from gpushift.switch.run import Plan, SwitchRun
from gpushift.switch.steps import Steps
from gpushift.values import OFF, GpuReading, HostGpuFacts, Outcome, Phase, SwitchRecord, UnitState

__all__ = ["Plan", "Preflight", "already_there"]

#: How often the preflight reads memory that no process holds again while it waits for it.
ORPHAN_POLL_S = 0.1


def already_there(target: str, running: list[str]) -> str | None:
    """The message when nothing needs doing (the target alone serves, or ``off`` and nothing runs)."""
    if target == OFF and not running:
        return "no backend is running; the GPUs are free"
    if running == [target]:
        return f"{target} is already active"
    return None


class Preflight:
    def __init__(self, steps: Steps, log: Any, version: str) -> None:
        #: Sources of facts for a switch's row, asked with the target as the row is made (pre-warm:
        #: what was read for it); each returns named keys for the row's ``extra``.
        self.row_facts: list[Callable[[str], Mapping[str, Any]]] = []
        self.steps = steps
        self.ports = steps.ports
        self.log = log
        self.version = version
        self._known: dict[int, str] | None = None  # GPU index -> UUID at the last launch

    def known_gpus(self) -> dict[int, str]:
        """The GPUs as the last successful launch saw them (from the ledger, then kept up to date):
        a GPU that vanished or changed identity since then keeps the gate closed."""
        if self._known is None:
            self._known = {}
            try:
                rows = self.ports.ledger.list(limit=50)
            except GpushiftError as e:
                self.log.warning("known_gpus_unreadable", error=str(e))
                rows = []
            for r in rows:
                if r.outcome == Outcome.OK.value and self.learn(r):
                    break
        return dict(self._known)

    def learn(self, rec: SwitchRecord) -> bool:
        """Take the GPUs of a successful launch as the ones to expect from now on."""
        facts = rec.gpu_facts or {}
        gpus = {int(g["index"]): str(g["uuid"]) for g in facts.get("gpus") or [] if g.get("uuid")}
        if not gpus or facts.get("error"):
            return False
        self._known = gpus
        return True

    def plan(
        self,
        run: SwitchRun,
        config: Config,
        running: list[str],
        states: Mapping[str, UnitState] | None = None,
    ) -> Plan:
        """Gather the facts, fill the record, and decide whether the switch may go ahead.

        ``states``: the backends' units as the switch read them a moment ago to know what runs (by
        backend name); the target's and the doctor's are taken from there, not asked again."""
        ports = self.ports
        target = run.target
        # --restart: the target itself is stopped and started again through the gate.
        to_stop = [b for b in running if b != target or run.relaunch]
        known = self.known_gpus()
        # "All GPUs" means every GPU visible now AND every GPU the last launch saw: one that fell
        # off the bus is still watched (and, unreadable, keeps the gate closed).  One read of every
        # GPU, with who holds what, serves both that list and the readings before the switch.
        now = {r.index: r for r in self.steps.readings(None)}
        watched = gate_gpus(config, target, to_stop, sorted(set(now) | set(known)))
        rec = self._record(run, running)
        target_cfg = config.backends.get(target) if target != OFF else None
        plan = Plan(rec, running, to_stop, watched, target_cfg, target in running and not run.relaunch)
        if target_cfg is not None:
            st = (states or {}).get(target) or ports.units.state(target_cfg.unit)
            rec.unit = target_cfg.unit
            rec.unit_path = st.fragment_path or None
            rec.argv_configured = list(st.exec_start)
            if st.load_state != "loaded":
                plan.refusal = f"unit {target_cfg.unit} of backend {target} is {st.load_state}"
            for unit in units_of(target_cfg)[1:]:  # the other instances' units (switch/instances.py)
                load_state = ports.units.state(unit).load_state
                if plan.refusal is None and load_state != "loaded":
                    plan.refusal = f"unit {unit} of backend {target} is {load_state}"
        facts = ports.gpu.facts()  # read once: the ledger and the doctor share it
        rec.gpu_facts = facts.to_dict()
        if plan.refusal is None and not watched:
            plan.refusal = "no GPU is visible: cannot prove that any VRAM will be released"
        if plan.refusal is None:
            problems = identity_problems(facts, known, config.gpu.accepted_gpu_uuids, watched)
            if problems:
                plan.refusal = "; ".join(problems)
                plan.refusal_error = VramNotReleased.dbus_name()
        if plan.refusal is None and target_cfg is not None and ports.doctor is not None:
            plan.refusal = self._consult_doctor(run, config, facts, rec, states)
        missing = [i for i in watched if i not in now]  # seen at the last launch, not visible now
        if missing:
            now.update((r.index, r) for r in self.steps.readings(missing))
        before = [now[i] for i in watched]
        if plan.refusal is None:
            before = self._foreign(run, plan, config, before)
        rec.vram["before"] = [r.to_dict() for r in before]
        return plan

    def _record(self, run: SwitchRun, running: list[str]) -> SwitchRecord:
        """The run's ledger row as the preflight begins it (who, why, from, to, the row's facts)."""
        rec = SwitchRecord(
            trigger=run.trigger.value,
            requested_by=run.requested_by,
            uid=run.uid,
            reason=run.reason,
            from_backend=run.from_backend,
            to_backend=run.target,
            started_at=run.started_at,
            ticket=run.ticket,
            gpushift_version=self.version,
        )
        if len(running) > 1:
            rec.extra["running_before"] = running
        rec.extra.update(run.details)
        for source in self.row_facts:
            try:
                rec.extra.update(source(run.target))
            except Exception as e:  # a fact source must never fail the switch
                self.log.warning("row_facts_failed", source=repr(source), error=repr(e))
        if run.relaunch:
            rec.extra["relaunch"] = True
        if run.recovery_attempt:
            rec.extra["recovery_attempt"] = run.recovery_attempt
        return rec

    def _foreign(
        self, run: SwitchRun, plan: Plan, config: Config, before: list[GpuReading]
    ) -> list[GpuReading]:
        """Refuse when the watched GPUs hold memory the backends being stopped do not account for.

        Memory that no live process holds is what a backend that has just stopped leaves while the
        driver frees it (a switch right after another, the simulated provider's release delay): it is
        read again for up to ``gpu.orphan_wait_s`` before the switch is refused.  Memory that a live
        process outside the backends holds, or a GPU that cannot be read, refuses at once.  Returns
        the readings the verdict rests on (the row's ``vram.before``)."""
        ports = self.ports
        own = [*plan.to_stop, *([plan.record.to_backend] if plan.target_running else [])]
        own_list = [u for b in own for u in units_of(config.backends[b])]
        own_units = set(own_list)
        own_pids: set[int] = set()
        for unit in own_list:
            own_pids.update(ports.units.processes(unit))
        verdict = foreign_memory(before, own_units, own_pids, config.gpu.residual_mib, ports.gpu.simulated)
        t0 = ports.clock.monotonic()
        told = False
        while not verdict.ok and verdict.orphaned and ports.clock.monotonic() - t0 < config.gpu.orphan_wait_s:
            if not told:
                wait = config.gpu.orphan_wait_s
                self.steps.report(run, Phase.PREFLIGHT, f"{verdict.message}: waiting up to {wait:g}s for it")
                told = True
            self.steps.beat()
            ports.clock.sleep(ORPHAN_POLL_S)
            before = self.steps.readings(plan.watched)
            verdict = foreign_memory(
                before, own_units, own_pids, config.gpu.residual_mib, ports.gpu.simulated
            )
        if not verdict.ok:
            plan.refusal = verdict.message
            plan.refusal_error = VramNotReleased.dbus_name()
        return before

    def _consult_doctor(
        self,
        run: SwitchRun,
        config: Config,
        facts: HostGpuFacts,
        rec: SwitchRecord,
        states: Mapping[str, UnitState] | None,
    ) -> str | None:
        """Preflight rules (gpushift check): errors refuse the switch, warnings are recorded."""
        assert self.ports.doctor is not None
        try:
            findings = list(self.ports.doctor(config, run.target, facts, states))
        except Exception as e:  # the doctor must never be why a switch fails
            self.log.exception("doctor_failed", ticket=run.ticket, error=repr(e))
            rec.extra["doctor_error"] = repr(e)
            return None
        rec.extra["doctor"] = [f.to_dict() for f in findings]
        for f in findings:
            if not f.is_error:
                self.log.warning(
                    "doctor_warning", ticket=run.ticket, backend=f.backend, code=f.code, message=f.message
                )
                self.steps.report(run, Phase.PREFLIGHT, f"warning: {f.message}")
        errors = [f for f in findings if f.is_error]
        if not errors:
            return None
        return "; ".join(f"{f.message}" + (f" ({f.hint})" if f.hint else "") for f in errors)
