"""A backend's command line — the one parser of an ``ExecStart=`` argv.

Everything that reads a backend's command line goes through here: the doctor (which flags a
launch uses), the launch description in the ledger (which model files it names), the ledger's
diff (which options changed) and the command lines people read (quoted with :mod:`shlex`).

Reading an argv the way the programs do:

* ``argv[0]`` is the program; ``python [interpreter options] -m MODULE`` or ``python SCRIPT`` count
  as the program as a whole, so the interpreter's own ``-m`` is never taken for llama-server's;
* ``--flag=value`` and ``--flag value`` are the same option; a flag followed by another flag (or by
  nothing) has no value; a negative number (``-5``) is a value, not a flag;
* vLLM's argument parser accepts ``--tensor_parallel_size`` for ``--tensor-parallel-size``, so for
  the ``vllm`` kind underscores in long option names are read as dashes;
* the last value of an option wins (argparse and llama.cpp both do that);
* an option of :data:`MULTI_VALUE_FLAGS` takes every word up to the next flag (argparse's
  ``nargs="+"``: vLLM's ``--served-model-name a b``); each word is one value, and
  :meth:`CommandLine.group` gives the words of its last occurrence.

systemd reports ``ExecStart`` as written, variables unexpanded (measured: ``"${SECS}"`` while the
process ran with ``1234``): :func:`expand` applies systemd's rules to the written form.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

#: Options whose value names a model file (llama-server, vLLM): the ledger fingerprints them, the
#: doctor checks that they exist.
MODEL_FILE_FLAGS = ("-m", "--model", "-md", "--model-draft", "-mm", "--mmproj", "-mmproj", "--lora")

#: Options that take one or more words (argparse ``nargs="+"``), per kind.
MULTI_VALUE_FLAGS: Mapping[str, frozenset[str]] = {"vllm": frozenset({"--served-model-name"})}

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_NUMBER = re.compile(r"-\d+(\.\d+)?")
_VAR_WORD = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_VAR_BRACED = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _NUMBER.fullmatch(tok)


def _norm(flag: str, kind: str) -> str:
    if kind == "vllm" and flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    return flag


def _program_end(argv: Sequence[str]) -> int:
    """Index of the first word that belongs to the program itself (after ``python -m MODULE``)."""
    if not argv or not _PYTHON.match(os.path.basename(argv[0])):
        return 1
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "-m":
            return min(i + 2, len(argv))
        if not tok.startswith("-"):
            return i + 1  # python SCRIPT
        i += 1
    return i


@dataclass(frozen=True)
class CommandLine:
    """An argv read as its program reads it.

    ``options`` keeps every option in order as ``(name, value)``; ``value`` is ``None`` for a flag
    without one.  Names are normalised for the kind (vLLM: underscores read as dashes).
    """

    program: str
    positional: tuple[str, ...] = ()
    options: tuple[tuple[str, str | None], ...] = ()
    kind: str = "generic"
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()  # a multi-value option's words, by occurrence

    def values(self, names: Collection[str]) -> list[str]:
        """Every value given to one of the spellings ``names`` of one option, first to last."""
        wanted = {_norm(n, self.kind) for n in names}
        return [v for n, v in self.options if n in wanted and v is not None]

    def value(self, names: Collection[str]) -> str | None:
        """The value the program will use: the last one given, or ``None``."""
        values = self.values(names)
        return values[-1] if values else None

    def group(self, names: Collection[str]) -> tuple[str, ...] | None:
        """The words of the last occurrence of a multi-value option (:data:`MULTI_VALUE_FLAGS`), or
        ``None`` when it is not given (argparse keeps the last occurrence's list)."""
        wanted = {_norm(n, self.kind) for n in names}
        found = [words for n, words in self.groups if n in wanted]
        return found[-1] if found else None

    def flags(self) -> dict[str, list[str | None]]:
        """Option name → its values in order (``None`` for a flag given without one)."""
        out: dict[str, list[str | None]] = {}
        for name, value in self.options:
            out.setdefault(name, []).append(value)
        return out

    @property
    def subcommand_argument(self) -> str | None:
        """``vllm serve MODEL``: the word after ``serve`` (vLLM's positional model)."""
        if len(self.positional) >= 2 and self.positional[0] == "serve":
            return self.positional[1]
        return None


def parse(argv: Sequence[str], kind: str = "generic") -> CommandLine:
    """Read ``argv`` (already expanded) the way its program does (see the module docstring)."""
    if not argv:
        return CommandLine(program="", kind=kind)
    start = _program_end(argv)
    positional: list[str] = []
    options: list[tuple[str, str | None]] = []
    groups: list[tuple[str, tuple[str, ...]]] = []
    multi = MULTI_VALUE_FLAGS.get(kind, frozenset())
    i = start
    while i < len(argv):
        tok = argv[i]
        if not _is_flag(tok):
            positional.append(tok)
        elif tok.startswith("--") and "=" in tok:
            name, value = tok.split("=", 1)
            options.append((_norm(name, kind), value))
            if _norm(name, kind) in multi:
                groups.append((_norm(name, kind), (value,)))
        elif _norm(tok, kind) in multi:
            j = i + 1
            while j < len(argv) and not _is_flag(argv[j]):
                j += 1
            words = tuple(argv[i + 1 : j])
            name = _norm(tok, kind)
            options.extend([(name, w) for w in words] or [(name, None)])
            groups.append((name, words))
            i = j - 1
        elif i + 1 < len(argv) and not _is_flag(argv[i + 1]):
            options.append((_norm(tok, kind), argv[i + 1]))
            i += 1
        else:
            options.append((_norm(tok, kind), None))
        i += 1
    return CommandLine(" ".join(argv[:start]), tuple(positional), tuple(options), kind, tuple(groups))


def model_files(argv: Sequence[str], kind: str = "generic") -> list[tuple[str, str]]:
    """``(option, value)`` for every model file or directory the argv names, in order.

    The model options of :data:`MODEL_FILE_FLAGS`, and vLLM's positional ``serve MODEL`` (reported
    as the option ``serve``).
    """
    cl = parse(argv, kind)
    wanted = set(MODEL_FILE_FLAGS)
    out: list[tuple[str, str]] = []
    served = cl.subcommand_argument
    if served is not None:
        out.append(("serve", served))
    out.extend((n, v) for n, v in cl.options if n in wanted and v)
    return out


def vllm_model(argv: Sequence[str]) -> str | None:
    """The model vLLM serves: ``--model`` (the last one), else ``vllm serve MODEL``."""
    cl = parse(argv, "vllm")
    return cl.value(("--model",)) or cl.subcommand_argument


# ----------------------------------------------------------------------------------- environment


def environment(entries: Sequence[str]) -> dict[str, str]:
    """``KEY=value`` strings (a unit's ``Environment=``) as a mapping; later ones win."""
    out: dict[str, str] = {}
    for item in entries:
        key, sep, value = item.partition("=")
        if sep and key:
            out[key] = value
    return out


def environment_file(text: str) -> dict[str, str]:
    """An ``EnvironmentFile=``'s variables, as systemd.exec(5) reads them: ``KEY=value`` lines,
    blank lines and those starting with ``#`` or ``;`` skipped, whitespace around the key and
    the value dropped, a value in single or double quotes taken without them (escapes inside them
    are not undone), a line ending in a backslash continued on the next; a line whose key is not a
    variable name is skipped (systemd ignores it too); later ones win."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        while line.endswith("\\"):
            line = line[:-1] + next(lines, "")
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _ENV_NAME.fullmatch(key):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def expand(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Expand environment variables in an ``ExecStart=`` argv the way systemd does.

    Following systemd.service(5): ``${VAR}`` anywhere in a word is replaced by the value, the word
    staying one argument; a word that is exactly ``$VAR`` is replaced by the value split at
    whitespace (no words when empty); ``$$`` is a literal ``$``; an unset variable is empty.  The
    first word (the executable) is expanded like any other.
    """
    out: list[str] = []
    for word in argv:
        whole = _VAR_WORD.fullmatch(word)
        if whole:
            out.extend(env.get(whole.group(1), "").split())
            continue
        out.append(_VAR_BRACED.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), ""), word))
    return out


def undefined_variables(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The variables ``argv`` uses that ``env`` does not define, in order of first use."""
    seen: list[str] = []
    for word in argv:
        whole = _VAR_WORD.fullmatch(word)
        names = [whole.group(1)] if whole else [m.group(1) for m in _VAR_BRACED.finditer(word) if m.group(1)]
        for name in names:
            if name not in env and name not in seen:
                seen.append(name)
    return seen


# ----------------------------------------------------------------------------------- for people


def join(argv: Sequence[str], wrap: bool = False) -> str:
    """A shell-quoted command (:func:`shlex.quote`); ``wrap`` puts each option on its own line."""
    toks = [shlex.quote(t) for t in argv]
    if not wrap:
        return " ".join(toks)
    lines: list[str] = []
    for t in toks:
        if lines and t.startswith("-"):
            lines.append(t)
        elif lines:
            lines[-1] += " " + t
        else:
            lines.append(t)
    return " \\\n  ".join(lines)
