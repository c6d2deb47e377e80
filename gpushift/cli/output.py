"""How the ``gpushift`` command prints — the last guard between text from outside and a
terminal, and the colour conventions.

* Human output goes through :func:`say`: credentials are masked (:func:`gpushift.safetext.redact.redact_text`)
  and every character a terminal would obey is escaped (:func:`gpushift.safetext.terminal.escape`), except
  the newlines of the output's own lines and the colour codes gpushift added itself.  Renderers
  escape each value from outside before laying it out (a newline inside a value must not forge a
  line); :func:`say` catches whatever a renderer missed.
* JSON goes through :func:`say_json`: still JSON, with nothing raw a terminal obeys.
* Colour only when the stream is a terminal and ``NO_COLOR`` is not set to a non-empty value
  (https://no-color.org: "when present and not an empty string (regardless of its value), prevents
  the addition of ANSI color"), and only on a few words: outcomes and failing health.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

import click

from gpushift.safetext import redact, terminal

# Select Graphic Rendition, as click.style writes it: the only escape sequence gpushift prints.
_SGR = re.compile(r"\x1b\[[0-9;]*m")

#: Outcomes (gpushift.values.Outcome) and states by colour; a word not here is printed plain.
COLOURS = {
    "ok": "green",
    "rolled_back": "yellow",
    "refused": "yellow",
    "interrupted": "yellow",
    "pending": "cyan",
    "failed": "red",
    "crashed": "red",
    "unhealthy": "red",
    "FAILING": "red",
    "DOWN": "red",
}

Paint = Callable[[str], str]


def colour_wanted(err: bool = False) -> bool:
    """True when colour may be added to stdout (stderr with ``err``): a terminal, and no ``NO_COLOR``."""
    if os.environ.get("NO_COLOR"):
        return False
    stream = sys.stderr if err else sys.stdout
    # click's own test (not a terminal: strip), looked up at call time: CliRunner(color=...) sets it.
    strip: Callable[[object], bool] = getattr(click.utils, "should_strip_ansi")  # noqa: B009
    return not strip(stream)


def painter(err: bool = False) -> Paint | None:
    """A function that colours one known word (padding around it kept plain); None when colour is
    not wanted."""
    if not colour_wanted(err):
        return None

    def paint(text: str) -> str:
        word = text.strip()
        colour = COLOURS.get(word)
        if colour is None or not word:
            return text
        start = text.index(word)
        return (
            text[:start]
            + click.style(word, fg=colour, bold=True if colour == "red" else None)
            + text[start + len(word) :]
        )

    return paint


def safe(text: str) -> str:
    """``text`` ready for a terminal: credentials masked, control characters escaped, except the
    newlines and gpushift's own colour codes."""
    out: list[str] = []
    pos = 0
    for m in _SGR.finditer(text):
        out += [terminal.escape(redact.redact_text(text[pos : m.start()]), keep_newlines=True), m.group()]
        pos = m.end()
    out.append(terminal.escape(redact.redact_text(text[pos:]), keep_newlines=True))
    return "".join(out)


def say(text: str, err: bool = False, nl: bool = True) -> None:
    """Print human output (see :func:`safe`)."""
    click.echo(safe(text), err=err, nl=nl)


def say_json(json_text: str, err: bool = False) -> None:
    """Print JSON text: still JSON, with the characters a terminal obeys as ``\\uXXXX``."""
    click.echo(terminal.json_safe(json_text), err=err)


def leave(code: int = 0) -> NoReturn:
    """End the command once its last line is out: the output is flushed and the process ends
    without the interpreter's teardown (freeing every module and object: 15–30 ms measured at the
    end of a switch, while the daemon samples what the switch left beside it; more after
    ``gpushift fleet`` has loaded its database driver, docs/benchmarks.md).  Only when this process is the
    ``gpushift`` command itself; a caller that runs the commands in its own process (click's test
    runner) gets an ordinary exit.  Callers close what they opened first (a database connection)."""
    from gpushift.cli import main

    if getattr(sys.modules.get("__main__"), "main", None) is main:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said
                stream.flush()
        os._exit(code)
    sys.exit(code)
