"""Write gpushift(1) from the click command tree, so the manual never drifts from ``--help``.

    python packaging/manpage.py -o build/man/gpushift.1

Every command and sub-command is on the page, the lazily loaded groups (``ledger``, ``schedule``,
``check``) included: the walk asks each group for its commands the way ``--help`` and shell
completion do (``list_commands`` then ``get_command``).  Each gets its usage line, its help text and
its options with their help, as ``gpushift COMMAND --help`` prints them.  The exit codes come from
``gpushift.errors``.  The date on the page is ``$SOURCE_DATE_EPOCH`` when set (reproducible builds),
else today.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

#: Files the daemon and the CLI use; where ``make install`` puts the rest is in docs/install.md.
FILES = (
    ("/etc/gpushift/gpushift.toml", "The configuration (--config or $GPUSHIFT_CONFIG name another)."),
    (
        "/etc/gpushift/schedule",
        "The schedule: crontab(5) lines naming a backend (the config names the file).",
    ),
    ("/var/lib/gpushift/ledger.db", "The deployment ledger (mode 0640, group gpushift)."),
    ("/run/gpushift/", "The pending ledger spool, kept while the database cannot be written."),
)
SEE_ALSO = ("systemctl(1)", "journalctl(1)", "systemd.service(5)", "crontab(5)")


def walk(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[click.Context, click.Command]]:
    """``cmd`` and every command below it, depth first, each with a context whose command path is
    its full name (``gpushift ledger show``)."""
    yield ctx, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings))


def esc(text: str) -> str:
    """Escape text for roff: backslashes, hyphens as minus signs (options copy and paste), a
    leading dot or quote; `code` in help texts becomes bold."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return "\n".join(("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in text.split("\n"))


def help_paragraphs(text: str) -> list[str]:
    """roff for a click help text: paragraphs are refilled, a paragraph opened by a ``\\b`` line is
    kept as written (click's rule), and ``\\f`` ends the text."""
    text = text.split("\f", 1)[0]
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        lines = para.split("\n")
        if lines[0].strip() == "\b":
            out.append(".nf\n" + esc("\n".join(lines[1:])) + "\n.fi")
        else:
            out.append(esc(" ".join(ln.strip() for ln in lines)))
    return out


def options(cmd: click.Command, ctx: click.Context) -> list[str]:
    out = []
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or not (isinstance(param, click.Option) or record[1]):
            continue  # hidden options; arguments without a help text of their own (usage names them)
        names, help_text = record
        out += [".TP", f"\\fB{esc(names)}\\fR", esc(help_text) if help_text else ""]
    return [ln for ln in out if ln != ""]


def command_section(cmd: click.Command, ctx: click.Context) -> list[str]:
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    lines = [f'.SS "{esc(ctx.command_path)}"', f"\\fB{esc(ctx.command_path)}\\fR {esc(usage)}", ".PP"]
    for para in help_paragraphs(cmd.help or cmd.short_help or ""):
        lines += [para, ".PP"]
    lines += options(cmd, ctx)
    return lines


#: What each exit code means to a person, by error class; a class missing here (a new one) is
#: described by its docstring's first line instead.
EXIT_MEANING = {
    "GpushiftError": "any other failure (check: the preflight found an error)",
    "ConfigError": "invalid config or schedule",
    "InvalidArgument": "an invalid argument (the message names it; nothing was changed)",
    "UnknownBackend": "unknown backend",
    "SwitchInProgress": "a switch is already running",
    "AccessDenied": "access denied (neither root nor a member of group gpushift)",
    "DaemonUnavailable": "the daemon is not running, or was lost during the switch",
    "SwitchFailed": "the switch failed (refused, rolled back, failed)",
    "VramNotReleased": "VRAM held by a process outside the backends, or not released after the stop",
    "NothingToCancel": "no switch to cancel",
    "CancelRefused": "the switch cannot be cancelled now (it is rolling back)",
    "SystemdError": "systemd refused or failed a job",
    "LedgerError": "the ledger could not be read or written",
}


def exit_codes() -> list[tuple[int, str]]:
    """(code, what) for every error class of gpushift.errors, lowest code first."""
    from gpushift.errors import GpushiftError

    found: dict[int, list[str]] = {}
    stack: list[type[GpushiftError]] = [GpushiftError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        doc = (cls.__doc__ or cls.__name__).strip().split("\n")[0].rstrip(".")
        found.setdefault(cls.code, []).append(EXIT_MEANING.get(cls.__name__, doc))
    return [(code, "; ".join(sorted(found[code]))) for code in sorted(found)]


def page(main: click.Command, version: str, summary: str, date: str) -> str:
    root = click.Context(main, info_name="gpushift", **main.context_settings)
    sections = list(walk(main, root))
    lines = [
        f'.TH GPUSHIFT 1 "{date}" "gpushift {esc(version)}" "User Commands"',
        ".SH NAME",
        f"gpushift \\- {esc(summary)}",
        ".SH SYNOPSIS",
        f"\\fBgpushift\\fR {esc(' '.join(main.collect_usage_pieces(root)))}",
        ".SH DESCRIPTION",
    ]
    for para in help_paragraphs(main.help or ""):
        lines += [para, ".PP"]
    lines += [".SH OPTIONS", *options(main, root), ".SH COMMANDS"]
    for ctx, cmd in sections[1:]:
        lines += command_section(cmd, ctx)
    lines += [".SH EXIT STATUS", ".TP", "\\fB0\\fR", "Success."]
    for code, what in exit_codes():
        lines += [".TP", f"\\fB{code}\\fR", esc(what[:1].upper() + what[1:]) + "."]
    lines += [".SH ENVIRONMENT", ".TP", "\\fBGPUSHIFT_CONFIG\\fR", "The config file, as --config."]
    lines += [".SH FILES"]
    for path, what in FILES:
        lines += [".TP", f"\\fI{esc(path)}\\fR", esc(what)]
    lines += [
        ".SH SEE ALSO",
        ", ".join(f"\\fB{esc(n.split('(')[0])}\\fR({n.split('(')[1]}" for n in SEE_ALSO),
    ]
    return "\n".join(ln.rstrip() for ln in lines) + "\n"


def build_date() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        if epoch
        else datetime.datetime.now(datetime.timezone.utc)
    )
    return when.strftime("%Y-%m-%d")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-o", "--output", help="write here (default: stdout)")
    args = parser.parse_args(argv)

    from gpushift import __version__
    from gpushift.cli import main as cli

    try:
        summary = importlib.metadata.metadata("gpushift")["Summary"]
    except importlib.metadata.PackageNotFoundError:
        summary = (cli.help or "").strip().split("\n")[0]
    text = page(cli, __version__, summary, build_date())
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
