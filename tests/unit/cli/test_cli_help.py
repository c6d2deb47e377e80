"""Every command's ``--help`` ends its description with an "Examples:" section a person can copy:
each example line names that command (or one below it) and parses with the options and arguments
the command really has, so a renamed option or a surplus argument in an example fails here."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from gpushift.cli import main


def _commands() -> list[tuple[str, ...]]:
    """Every command path under ``gpushift``, the lazy groups loaded."""
    found: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...], ctx: click.Context) -> None:
        found.append(path)
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, f"{' '.join(path)} lists {name} but cannot load it"
                walk(sub, (*path, name), click.Context(sub, parent=ctx, info_name=name))

    walk(main, ("gpushift",), click.Context(main, info_name="gpushift"))
    return found


COMMANDS = _commands()


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*path[1:], "--help"], env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def _examples(help_text: str) -> list[str]:
    """The example lines of a rendered --help: the indented ``gpushift ...`` lines after "Examples:"."""
    lines = help_text.splitlines()
    assert any(line.strip() == "Examples:" for line in lines), help_text
    start = next(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    out = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        out.append(line.strip())
    return out


def _words(example: str) -> list[str]:
    """The example's words, up to a shell comment, pipe or redirection."""
    lexer = shlex.shlex(example, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if word and word[0] in "|<>;&":
            break
        words.append(word)
    return words


def _resolve(words: list[str]) -> tuple[str, ...]:
    """Parse ``words`` as the shell would hand them to gpushift, group by group, as click does;
    a bad option or an argument too many raises click's UsageError.  Returns the command's path."""
    assert words[0] == "gpushift", words
    cmd: click.Command = main
    path: tuple[str, ...] = ("gpushift",)
    parent: click.Context | None = None
    args = words[1:]
    while True:
        try:
            ctx = cmd.make_context(path[-1], list(args), parent=parent)
        except click.exceptions.Exit as e:  # an eager option (--version, --help) answered
            assert e.exit_code == 0, words
            return path
        if not isinstance(cmd, click.Group):
            return path
        protected = getattr(ctx, "_protected_args", None)
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        if not rest:
            return path
        name, sub, args = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None, rest
        cmd, path, parent = sub, (*path, name), ctx


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p))
def test_every_command_has_examples_that_parse(path: tuple[str, ...]) -> None:
    examples = _examples(_help(path))
    assert examples, f"{' '.join(path)} --help has an empty Examples: section"
    for example in examples:
        assert example.startswith("gpushift "), (path, example)
        try:
            resolved = _resolve(_words(example))
        except click.UsageError as e:
            pytest.fail(f"{' '.join(path)} --help: example {example!r} does not parse: {e.format_message()}")
        assert resolved[: len(path)] == path, f"{' '.join(path)} --help shows an example of {resolved}"


def test_the_walk_sees_every_command() -> None:
    """The lazily loaded groups and their subcommands are part of the walk (not only the top)."""
    names = {" ".join(p) for p in COMMANDS}
    for expected in (
        "gpushift switch",
        "gpushift ledger show",
        "gpushift ledger verify",
        "gpushift schedule check",
        "gpushift check",
        "gpushift daemon",
    ):
        assert expected in names, sorted(names)


@pytest.mark.parametrize(
    "example",
    [
        "gpushift switch llama --no-such-option",
        "gpushift ledger show 1 2",
        "gpushift status extra",
        "gpushift ledger show",
    ],
)
def test_a_wrong_example_is_caught(example: str) -> None:
    """The parse above is strict: an unknown option, a surplus or a missing argument is an error."""
    with pytest.raises(click.UsageError):
        _resolve(_words(example))
