"""The daemon's mirror (``[mirror]``, docs/fleet.md): built from the daemon's parts, poked by them.

:func:`start` builds the :class:`~gpushift.fleet.mirror.Mirror` over the daemon's ledger path and
state directory, makes it a listener of the switcher (every switch event pokes it: an
``Event.set``, nothing else happens on the worker) and starts its thread; None without ``[mirror]
url``.  :func:`host_state` is the host's row in the central database, from memory only (the
sampler's latest sample, the keeper's fields, the ledger's view).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gpushift import __version__

if TYPE_CHECKING:
    from gpushift.fleet.mirror import Mirror


class _Daemon(Protocol):
    config: Any
    sampler: Any
    keeper: Any
    switcher: Any
    components: Any
    log: Any
    stagger: Any


def start(d: _Daemon) -> Mirror | None:
    m = d.config.mirror
    if not m.enabled:
        return None
    from gpushift.fleet.mirror import Mirror
    from gpushift.host.identity import host_name, machine_id

    mirror = Mirror(
        m,
        host_name(m.host_name),
        machine_id(),
        d.config.ledger_path,
        d.config.daemon.state_dir,
        lambda: host_state(d),
        d.log,
    )
    d.switcher.add_listener(lambda _event: mirror.poke())
    mirror.start()
    return mirror


def host_state(d: _Daemon) -> dict[str, Any]:
    """Who serves, the mode, the next switch, the last switch and its outcome, the ledger's head and
    health, the gpushift version (memory only: called on the mirror's thread)."""
    from gpushift.sampler.sample import verdict

    sample = d.sampler.snapshot()
    active = verdict(sample, d.components.ports.clock.monotonic()).active
    ks = d.keeper.status()
    nxt = (ks.get("schedule") or {}).get("next")
    view = d.components.ledger_view()
    last = next((r for r in view.rows if r.outcome != "chain_break"), None)
    cur = d.switcher.current()
    state = {
        "serving": active,
        "mode": ks.get("mode"),
        "switching": cur.target if cur is not None else None,
        "next_switch": {"at": nxt["at"], "target": nxt["target"]} if nxt else None,
        "last_switch": (
            {
                "id": last.id,
                "from": last.from_backend,
                "to": last.to_backend,
                "outcome": last.outcome,
                "started_at": last.started_at.isoformat() if last.started_at else None,
                "finished_at": last.finished_at.isoformat() if last.finished_at else None,
                "message": (last.message or "")[:500] or None,
            }
            if last is not None
            else None
        ),
        "ledger": {
            "head_id": max((r.id for r in view.rows if r.id is not None and r.id > 0), default=0),
            "state": view.health.get("state"),
        },
        "stagger": d.stagger,
        "gpushift_version": __version__,
    }
    from gpushift.safetext import redact

    masked: dict[str, Any] = redact.redact_tree(state)  # a message may quote a command line's secret
    return masked


def stagger_of(config: Any) -> dict[str, Any] | None:
    """This host's stagger (``[daemon] stagger_s``; docs/fleet.md), None without one."""
    from gpushift.host.identity import stagger

    return stagger(config)
