"""``gpushift frontdoor``: run the front door in the foreground (what gpushift-frontdoor.service runs).

Loaded only when invoked (``gpushift/cli/__init__.py``'s lazy commands), so the rest of the CLI
never pays for it, and it imports nothing of the daemon's process.
"""

from __future__ import annotations

import sys

import click


@click.command(short_help="Run the front door: one address for models.")
@click.option(
    "--config",
    "config_path",
    metavar="PATH",
    default=None,
    help="Config file (default: gpushift's --config, $GPUSHIFT_CONFIG, else /etc/gpushift/gpushift.toml).",
)
@click.pass_context
def frontdoor(ctx: click.Context, config_path: str | None) -> None:
    """Run the front door in the foreground: the one HTTP address clients use for every model.

    It forwards each request (OpenAI-compatible routes, and a backend's own ones) to the backend
    that serves its model now, holds requests through a switch until the new backend is ready, and
    answers a model that is not served with a 503 saying when it is (Retry-After).  It learns what
    serves from the gpushift daemon over D-Bus ([daemon] bus) and owns org.gpushift.FrontDoor1 there,
    which the daemon calls at every drain and switch.  It never starts a switch itself.

    Under systemd (units/gpushift-frontdoor.socket and .service, user gpushift-frontdoor) it serves
    the socket unit's sockets, so a restart never refuses a connection; started by hand it binds
    [frontdoor] listen.  It needs a [frontdoor] table in the config; docs/frontdoor.md has the
    details (and how to move a host whose clients use the backends' ports today).

    On a host, `systemctl enable --now gpushift-frontdoor.socket`: systemd starts the service at
    the first connection.  Stops on SIGTERM after the requests in flight end (at most 20 s).  Exit
    status 2: bad config or no [frontdoor] table; 1: the sockets could not be had.

    \b
    Examples:
      gpushift frontdoor                          # as systemd runs it (ExecStart=)
      gpushift frontdoor --config ./gpushift.toml
    """
    from gpushift.frontdoor.main import main as frontdoor_main

    path = config_path if config_path is not None else (ctx.obj or {}).get("config_path")
    sys.exit(frontdoor_main(path))
