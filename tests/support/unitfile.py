"""The directives of a unit file, and the process credentials its capability lines give a service.

The tests that check the shipped units read them with this module: ``systemd-analyze verify`` of
every unit, and the tests that run gpushift's holder scan with exactly the capabilities
``units/gpushift.service`` leaves the daemon (``setpriv`` arguments built from its lines).
"""

from __future__ import annotations

#: systemd's spelling of a yes (systemd.syntax(7), "boolean").
_TRUE = {"1", "yes", "y", "true", "t", "on"}


def directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of every assignment, in file order, backslash continuations joined."""
    out: list[tuple[str, str, str]] = []
    section, pending = "", ""
    for raw in text.splitlines():
        line = (pending + " " + raw.strip()) if pending else raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            key, value = line.split("=", 1)
            out.append((section, key.strip(), value.strip()))
    return out


def values(text: str, key: str, section: str = "Service") -> list[str]:
    """Every value assigned to ``key`` in ``section``, in order (an empty one is a reset)."""
    return [v for s, k, v in directives(text) if s == section and k == key]


def last(text: str, key: str, section: str = "Service") -> str | None:
    """The value that is in force for a single-valued key (the last assignment), or None."""
    found = values(text, key, section)
    return found[-1] if found else None


def capability_set(text: str, key: str) -> list[str] | None:
    """The capabilities ``CapabilityBoundingSet=`` or ``AmbientCapabilities=`` leave, lower case
    without ``CAP_`` (setpriv's spelling), in first-seen order.

    Returns None when the unit never sets ``key`` (systemd's default then applies: every capability
    for the bounding set, none for the ambient set).  Lines add up; an empty one resets.  A ``~``
    line (a deny list) is not supported: the shipped unit names what it keeps.
    """
    assigned = values(text, key)
    if not assigned:
        return None
    caps: list[str] = []
    for value in assigned:
        if not value:
            caps = []
            continue
        if value.startswith("~"):
            raise ValueError(f"{key}={value}: a deny list is not supported here; name the kept set")
        for name in value.split():
            cap = name.lower().removeprefix("cap_")
            if cap not in caps:
                caps.append(cap)
    return caps


def is_true(value: str | None) -> bool:
    return value is not None and value.lower() in _TRUE


def setpriv_args(text: str, drop: tuple[str, ...] = ()) -> list[str]:
    """``setpriv`` options that give a root process what the unit gives its (root) service.

    For a service running as root, systemd limits the bounding set to ``CapabilityBoundingSet=``;
    the exec of the daemon then gives root exactly that set.  Inheritable and ambient sets hold
    ``AmbientCapabilities=``; ``NoNewPrivileges=yes`` adds ``--no-new-privs``.

    Args:
        text: the unit file.
        drop: capabilities (setpriv spelling, e.g. ``"sys_ptrace"``) to take away as well, for
            tests that show a capability is needed.
    """
    bounding = capability_set(text, "CapabilityBoundingSet")
    ambient = capability_set(text, "AmbientCapabilities") or []
    if bounding is None:
        raise ValueError("the unit sets no CapabilityBoundingSet=: its service would keep every capability")
    kept = [c for c in bounding if c not in drop]
    ambient = [c for c in ambient if c in kept]
    args = [
        "--bounding-set=" + ",".join(["-all", *(f"+{c}" for c in kept)]),
        "--inh-caps=" + ",".join(["-all", *(f"+{c}" for c in ambient)]),
        "--ambient-caps=" + ",".join(["-all", *(f"+{c}" for c in ambient)]),
    ]
    if is_true(last(text, "NoNewPrivileges")):
        args.append("--no-new-privs")
    return args


def hidepid_options(text: str) -> str:
    """The mount options of the ``/proc`` the unit's ``ProtectProc=``/``ProcSubset=`` give it."""
    options = []
    protect = last(text, "ProtectProc") or "default"
    if protect != "default":
        options.append(f"hidepid={protect}")
    subset = last(text, "ProcSubset") or "all"
    if subset != "all":
        options.append(f"subset={subset}")
    return ",".join(options)
