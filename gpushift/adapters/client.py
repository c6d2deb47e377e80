"""L4: the CLI's side of the D-Bus API — calls with timeouts, remote errors back into our classes.

A switch is followed through the ``Progress``/``Finished`` signals that carry our ticket.  The
subscription is made BEFORE the call (a signal may arrive before the call returns), and the bus
name's owner is watched: if the daemon goes away mid-switch the client says so instead of waiting
forever.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import DaemonUnavailable
from .bus import connect
from .dbus_args import variant_types
from .dbus_errors import translate
from .dbus_names import BUS_NAME, INTERFACE, OBJECT_PATH

CALL_TIMEOUT_S = 30


class Client:
    """A connection to the daemon on the system or session bus."""

    def __init__(self, bus_kind: str = "system") -> None:
        self.bus = connect(bus_kind, error=DaemonUnavailable)
        self.bus_kind = bus_kind

    def _proxy(self) -> Any:
        from gi.repository import GLib

        try:
            return self.bus.get(BUS_NAME, OBJECT_PATH, timeout=CALL_TIMEOUT_S)
        except GLib.Error as e:
            raise translate(e) from None
        except KeyError as e:  # pydbus: interface missing in introspection
            raise DaemonUnavailable(f"the daemon on the bus does not offer {INTERFACE}: {e}") from None

    def _call(self, method: str, *args: Any) -> Any:
        from gi.repository import GLib

        proxy = self._proxy()
        try:
            return getattr(proxy, method)(*args, timeout=CALL_TIMEOUT_S)
        except GLib.Error as e:
            raise translate(e) from None

    def owner(self) -> str | None:
        from gi.repository import GLib

        try:
            return str(self.bus.dbus.GetNameOwner(BUS_NAME))
        except GLib.Error:
            return None

    def _switch_call(self, backend: str, options: dict[str, Any]) -> str:
        """``SwitchTo`` with typed options; ``SwitchWithOptions`` (JSON) for a daemon older than it."""
        from gi.repository import GLib

        proxy = self._proxy()
        try:
            method = getattr(proxy, "SwitchTo", None)  # absent from an older daemon's introspection
            if method is None:
                return str(proxy.SwitchWithOptions(backend, json.dumps(options), timeout=CALL_TIMEOUT_S))
            typed = {k: GLib.Variant(t, v) for k, (t, v) in variant_types(options).items()}
            return str(method(backend, typed, timeout=CALL_TIMEOUT_S))
        except GLib.Error as e:
            raise translate(e) from None

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self._call("GetStatus")))

    def cancel(self) -> str:
        return str(self._call("Cancel"))

    def resume(self) -> str:
        return str(self._call("Resume"))

    def reload(self) -> str:
        return str(self._call("Reload"))

    def switch(
        self,
        backend: str,
        options: dict[str, Any],
        on_progress: Callable[[str, str], None] | None = None,
        wait: bool = True,
    ) -> dict[str, Any]:
        """Ask for a switch; with ``wait``, follow it to the end and return the Finished result.

        Raises DaemonUnavailable when the daemon's bus name disappears before Finished arrives.
        """
        from gi.repository import GLib

        if not wait:
            ticket = self._switch_call(backend, options)
            return {"ticket": ticket, "queued": True}

        owner = self.owner()
        if owner is None:
            raise DaemonUnavailable("the gpushift daemon is not running on this bus")
        loop = GLib.MainLoop()
        state: dict[str, Any] = {"ticket": None, "events": [], "result": None, "gone": False}

        def deliver(ev: tuple[str, Any, Any, Any]) -> None:
            kind, ticket, a, b = ev
            if ticket != state["ticket"]:
                return
            if kind == "Progress" and on_progress is not None:
                on_progress(str(a), str(b))
            elif kind == "Finished":
                try:
                    state["result"] = json.loads(b)
                except ValueError:
                    state["result"] = {"ok": bool(a), "message": str(b)}
                loop.quit()

        def on_signal(sender: str, obj: str, iface: str, signal: str, params: Any) -> None:
            ev = (signal, params[0], params[1], params[2])
            if state["ticket"] is None:
                state["events"].append(ev)  # arrived before the call returned
            else:
                deliver(ev)

        def on_owner(name: str, old: str, new: str) -> None:
            if name == BUS_NAME and not new:
                state["gone"] = True
                loop.quit()

        def check_owner() -> bool:
            if self.owner() != owner:
                state["gone"] = True
                state["timer_done"] = True
                loop.quit()
                return False
            return True

        sub = self.bus.subscribe(sender=BUS_NAME, iface=INTERFACE, object=OBJECT_PATH, signal_fired=on_signal)
        owner_sub = self.bus.subscribe(
            sender="org.freedesktop.DBus",
            iface="org.freedesktop.DBus",
            signal="NameOwnerChanged",
            arg0=BUS_NAME,
            signal_fired=lambda *a: on_owner(*a[4]),
        )
        timer = GLib.timeout_add(2000, check_owner)
        try:
            ticket = self._switch_call(backend, options)
            state["ticket"] = ticket
            for ev in state["events"]:
                deliver(ev)
            if state["result"] is None and not state["gone"]:
                loop.run()
        finally:
            if not state.get("timer_done"):
                GLib.source_remove(timer)
            sub.unsubscribe()
            owner_sub.unsubscribe()
        if state["result"] is None:
            raise DaemonUnavailable(
                f"the gpushift daemon went away during switch {state['ticket']} "
                "(see `gpushift status` and `journalctl -u gpushift`)"
            )
        result = dict(state["result"])
        result.setdefault("ticket", state["ticket"])
        return result
