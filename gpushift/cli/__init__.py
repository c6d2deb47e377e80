"""The `gpushift` command (click).  A D-Bus client of the daemon, plus read-only views.

Imports are lazy: `gpushift --help` and `gpushift ledger` must not pay for GLib, pydbus or NVML.
Sub-command groups that live in their own modules are loaded only when invoked.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
from typing import Any, NoReturn

import click

from gpushift.cli import params
from gpushift.cli.output import leave, painter, say, say_json
from gpushift.cli.status_text import render_status
from gpushift.errors import DaemonUnavailable, GpushiftError
from gpushift.safetext import redact, terminal

_LAZY = {
    "ledger": (
        "gpushift.cli.ledger",
        "ledger",
        "List the ledger of every switch and launch.",
    ),
    "schedule": (
        "gpushift.cli.schedule",
        "schedule",
        "List the next switches of the schedule.",
    ),
    "check": (
        "gpushift.cli.check",
        "check",
        "Check config, units and GPUs before a switch.",
    ),
    "fleet": (
        "gpushift.cli.fleet",
        "fleet",
        "All hosts of the fleet, from one database.",
    ),
    "frontdoor": (
        "gpushift.cli.frontdoor",
        "frontdoor",
        "Run the front door: one address for models.",
    ),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self._available()])

    def _available(self) -> list[str]:
        out = []
        for name, (mod, _attr, _help) in _LAZY.items():
            if importlib.util.find_spec(mod) is not None:
                out.append(name)
        return out

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in _LAZY:
            return cmd
        mod, attr, _help = _LAZY[name]
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError:
            return None
        return getattr(module, attr)  # type: ignore[no-any-return]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in _LAZY and name not in self.commands:
                rows.append((name, _LAZY[name][2]))
            else:
                cmd = self.commands.get(name)
                if cmd is not None and not cmd.hidden:
                    rows.append((name, cmd.get_short_help_str(limit=80)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _fail(e: GpushiftError) -> None:
    say(f"gpushift: {e}", err=True)
    sys.exit(e.code)


def _leave(code: int = 0) -> NoReturn:
    """End the command once its last line is out, without the interpreter's teardown
    (:func:`gpushift.cli.output.leave`)."""
    leave(code)


def _config(ctx: click.Context) -> Any:
    from gpushift.config import schema as config_mod

    return config_mod.load(ctx.obj["config_path"])


def _bus(ctx: click.Context) -> str:
    """The daemon's bus: ``[daemon] bus`` read without validating the rest of the config (the daemon
    validated its own; a status needs nothing else before it asks), else the config loaded in full,
    whose error then says what is wrong."""
    from gpushift.config import textfile

    return textfile.daemon_bus(ctx.obj["config_path"]) or str(_config(ctx).daemon.bus)


def _bus_kind(ctx: click.Context) -> str:
    """The daemon's bus, even from a config that no longer parses (reload must still reach it)."""
    try:
        return _bus(ctx)
    except GpushiftError:
        return "system"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from gpushift.cli.version import lines

    say("\n".join(lines()))
    ctx.exit(0)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    envvar="GPUSHIFT_CONFIG",
    help="Config file (default /etc/gpushift/gpushift.toml; env GPUSHIFT_CONFIG).",
)
@click.option(
    "--version",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_print_version,
    help="Show the versions of gpushift, Python, its dependencies and the NVIDIA driver, and exit.",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """gpushift time-shares one GPU host between inference servers.

    A daemon (`gpushift daemon`, run by systemd as gpushift.service) owns every switch: it drains
    and stops the running backend's unit, proves through NVML that the VRAM is free, starts the
    next unit, waits until it answers its health URL, and records the launch in a ledger.

    \b
    Examples:
      gpushift status                 # what runs, GPU memory and holders, last switch
      gpushift switch llama           # switch now (live progress; exit 0 when ready)
      gpushift switch off             # stop every backend, leave the GPUs free
      gpushift ledger                 # every launch, newest first
      gpushift --version              # gpushift, Python, dependencies, NVIDIA driver
      gpushift --config ./gpushift.toml check
    """
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path


@main.command(short_help="Run the daemon in the foreground.")
@click.pass_context
def daemon(ctx: click.Context) -> None:
    """Run the daemon in the foreground (what units/gpushift.service runs).

    \b
    Examples:
      gpushift daemon                 # as systemd runs it (ExecStart=)
      gpushift --config ./test.toml daemon
    """
    from gpushift.daemon import main as daemon_main

    sys.exit(daemon_main(ctx.obj["config_path"]))


# ------------------------------------------------------------------ status


def _local_status(ctx: click.Context, why: str) -> dict[str, Any]:
    """What the CLI can read itself while the daemon is down."""
    from gpushift.daemon import wiring

    cfg = _config(ctx)
    daemon = {"running": False, "state": "down", "error": why, "config": cfg.path}
    try:
        comps = wiring.build(cfg, readonly_ledger=True, tolerate_no_bus=True)
    except GpushiftError as e:
        return {
            "daemon": daemon,
            "active": None,
            "backends": {},
            "gpus": [],
            "simulated": cfg.gpu.provider == "simulated",
            "last_switch": None,
            "error": str(e),
        }
    report = wiring.status_report(comps, daemon)
    ledger = report.get("ledger") or {}
    if ledger.get("state") == "ok" and not os.path.lexists(cfg.ledger_path):  # nothing read: none yet
        report["ledger"] = {**ledger, "state": "absent", "path": cfg.ledger_path}
    return report


@main.command(short_help="Show what serves, the GPUs, the last switch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the daemon, the active backend, each backend's unit and health, GPU memory and holders.

    When the daemon is down, shows what the CLI can read itself (units, GPUs, ledger) and says so.
    Exit status 0 when the daemon runs, 6 when it is down.

    \b
    Examples:
      gpushift status
      gpushift status --json          # one JSON object, for scripts
    """
    try:
        bus = _bus(ctx)
        from gpushift.bus.lightclient import get_status

        try:
            s = get_status(bus)  # pure-Python D-Bus: no PyGObject on the read path
        except DaemonUnavailable as e:
            s = _local_status(ctx, str(e))
    except GpushiftError as e:
        _fail(e)
        return
    s = redact.redact_tree(s)  # also what an older daemon, or the CLI's own read, did not redact
    if as_json:
        say_json(json.dumps(s, indent=2, default=str))
    else:
        say(render_status(s, painter()))
    _leave(0 if (s.get("daemon") or {}).get("running") else DaemonUnavailable.code)


# ------------------------------------------------------------------ switch


@main.command(short_help="Switch the GPUs to a backend, or off.")
@click.argument("backend", type=params.BACKEND)
@click.option("--reason", default="", type=params.REASON, help="Why (recorded in the ledger; one line).")
@click.option("--no-wait", is_flag=True, help="Queue the switch and print its ticket; do not follow it.")
@click.option("--now", "skip_drain", is_flag=True, help="Skip the drain: stop the running backend at once.")
@click.option(
    "--restart",
    is_flag=True,
    help="BACKEND already serves: stop it and start it again through the whole gate (a new launch row).",
)
@click.option(
    "--when-idle",
    is_flag=True,
    help="Switch once the serving backend has no request in flight (its idle_s), at most its "
    "defer_while_busy_s (600 s when unset) later; returns at once.",
)
@click.option("--hold", is_flag=True, help="Keep BACKEND until `gpushift resume` (the schedule waits).")
@click.option(
    "--until",
    "until",
    metavar="TIME",
    type=params.UNTIL,
    help="Keep BACKEND until TIME ('2026-12-01 08:00').",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (progress goes to stderr).")
@click.pass_context
def switch(
    ctx: click.Context,
    backend: str,
    reason: str,
    no_wait: bool,
    skip_drain: bool,
    restart: bool,
    when_idle: bool,
    hold: bool,
    until: str | None,
    as_json: bool,
) -> None:
    """Switch the GPUs to BACKEND (a configured name, or `off` to free them).

    Prints one line per phase with elapsed seconds; exits 0 when BACKEND answers its health URL,
    non-zero with a one-line reason otherwise.  A switch to the active backend says so and exits 0.

    \b
    Examples:
      gpushift switch llama --reason "nightly eval"
      gpushift switch vllm --now      # skip the drain of in-flight requests
      gpushift switch llama --hold    # keep llama until `gpushift resume`
      gpushift switch llama --until "2026-12-01 08:00"
      gpushift switch vllm --restart  # relaunch the serving backend through the gate
      gpushift switch llama --when-idle
      gpushift switch off --no-wait   # print the ticket and return
    """
    from gpushift.bus import lightclient
    from gpushift.cli import switching

    options = switching.options(backend, reason, skip_drain, restart, when_idle, hold, until)
    no_wait = no_wait or when_idle  # the keeper makes the switch later: nothing to follow now
    t0 = time.monotonic()
    try:
        # Only the bus is read here (the config's validation is not imported: it would cost every
        # switch its time); the daemon validates the file on disk before it takes the switch, and a
        # broken one refuses it with the error naming file and key (exit 2), changing nothing.
        result = lightclient.switch(
            _bus(ctx), backend, options, on_progress=switching.progress_printer(t0, as_json), wait=not no_wait
        )
    except GpushiftError as e:
        switching.say_not_taken(e, as_json)
        _fail(e)
        return
    if no_wait:
        switching.say_queued(backend, result, as_json)
        return
    _leave(switching.say_finished(result, t0, as_json))


@main.command(short_help="Abort the switch in progress.")
@click.pass_context
def cancel(ctx: click.Context) -> None:
    """Abort the switch in progress (the failure policy then applies: rollback or stay).

    \b
    Examples:
      gpushift cancel
    """
    from gpushift.bus.client import Client

    try:
        ticket = Client(_bus_kind(ctx)).cancel()
    except GpushiftError as e:
        _fail(e)
        return
    say(f"cancelling switch {terminal.escape(ticket)}")


@main.command(short_help="Drop an override; obey the schedule again.")
@click.pass_context
def resume(ctx: click.Context) -> None:
    """Drop a manual override and obey the schedule again at once (switching if needed).

    \b
    Examples:
      gpushift resume
    """
    from gpushift.bus.client import Client

    try:
        say(Client(_config(ctx).daemon.bus).resume())
    except GpushiftError as e:
        _fail(e)


@main.command(short_help="Make the daemon re-read config and schedule.")
@click.pass_context
def reload(ctx: click.Context) -> None:
    """Make the daemon re-read config and schedule; waits until done (systemd's ExecReload=).

    An invalid file is rejected, the old one stays in force, and this exits non-zero.

    \b
    Examples:
      gpushift reload                 # what `systemctl reload gpushift` runs
    """
    from gpushift.bus.client import Client

    try:
        say(Client(_bus_kind(ctx)).reload())
    except GpushiftError as e:
        _fail(e)
