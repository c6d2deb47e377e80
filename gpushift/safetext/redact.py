"""What counts as a secret, and how it is hidden — the one home of the secret patterns.

A name is secret-looking when its last word says so: ``--api-key``, ``--hf-token``, ``HF_TOKEN``,
``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``, ``GOOGLE_APPLICATION_CREDENTIALS``.  The same pattern
serves command-line option names, environment variable names and the keys of JSON objects.  Only
the last word counts: vLLM's ``--max-num-batched-tokens`` and ``--ssl-keyfile`` are not credentials.
Besides named values, credentials in URLs (``http://user:pass@host/``) and ``Bearer``/``Basic``
tokens in text are secrets.

Two ways to hide a value: :data:`MASK` where only its presence matters (status, logs, a command
line shown to a person), :func:`digest` where a reader must still see that it changed (the
ledger: its diff shows that ``--api-key`` changed without showing it).  Both are idempotent: a
masked or digested value stays as it is, so applying a redaction to a record that already had one
(a new ledger row) changes nothing, and an old row's raw value becomes the same digest a new row
stores.

:func:`redact_tree` applies every rule to a JSON-like value (a status report, a ledger record, a
log line's fields); :func:`redact_text` to one free-text string.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

# ASCII case only (re.A): a program reads its variables and options byte for byte.
SECRET_NAME = re.compile(r"(?:^|[-_])(?:key|token|secret|passw(?:or)?d|credentials?)$", re.I | re.A)

MASK = "***"

#: ``mask``: the value becomes :data:`MASK`; ``digest``: :func:`digest` of it.
How = Literal["mask", "digest"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{16} \(redacted\)")

# Credentials in a URL: everything between "scheme://" and "@" (user and password alike: a token
# often stands where the user name goes, https://ghp_xxx@github.com/).
_URL_USERINFO = re.compile(r"(?ia)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]+@")
# In free text: an option with its value (--api-key=x, --api-key x), a variable assignment
# (HF_TOKEN=x), a JSON member ("api_key": "x"), an Authorization header value (Bearer x).  The
# name patterns match the name and its separator only; the value after it is _VALUE.
_OPTION_NAME = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|[ \t]+)")
_ASSIGN_NAME = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)(=)")
_VALUE = re.compile(r"'[^']*'|\"[^\"]*\"|[^\s'\",;]+")
_JSON_MEMBER = re.compile(
    r"""(["'])([A-Za-z0-9_.-]+)\1(\s*:\s*)(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\[[^\]]*\])"""
)
# An argv printed as a list: '--api-key', 's3cret'
# The value is in a lookahead: an option whose value is another option (``"-a", "--api-key", "x"``)
# must not swallow it, or that option's own value would be missed (a property test found it).
_LISTED = re.compile(r"""(["'])(--?[A-Za-z][\w.-]*)\1(?=(\s*,\s*)(["'])((?:(?!\4)[^\\]|\\.)*)\4)""")
_AUTH = re.compile(r"(?ia)\b(bearer|basic)([ \t]+)[A-Za-z0-9._~+/=-]{6,}")
# What any credential the rules below hide has in its lower-cased text: a secret-looking name, a
# URL's "@", an Authorization scheme.  (A superset: "monkey" has one too; it only costs the walk.)
_SECRET_WORDS = ("key", "token", "secret", "passw", "credential", "bearer", "basic", "@")
# A cheap test that a string may hold any of the above.
_MAYBE = re.compile(r"""[=@]|(?:^|[\s"'])--?[A-Za-z]|["']\s*:|(?i:bearer|basic)""")


@functools.lru_cache(maxsize=4096)  # the same few keys, again and again, in every record
def is_secret_name(name: str) -> bool:
    """True for an option or variable name that carries a credential."""
    return SECRET_NAME.search(name.lstrip("-")) is not None


def digest(value: str) -> str:
    """A short, stable stand-in for a secret value: equal values give equal digests."""
    import hashlib  # here: OpenSSL's loading would be paid by every CLI start (redact is on its path)

    return (
        "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16] + " (redacted)"
    )


def may_hold_secret(text: str) -> bool:
    """False when ``text`` (a whole record as JSON, say) certainly holds nothing that
    :func:`redact_tree` or :func:`redact_text` would hide: callers may skip the walk."""
    low = text.lower()
    return any(w in low for w in _SECRET_WORDS)


def is_hidden(value: str) -> bool:
    """True for a value that is already :data:`MASK` or a :func:`digest`."""
    return value == MASK or _DIGEST.fullmatch(value) is not None


def hide(value: str, how: How = "mask") -> str:
    """``value`` hidden the ``how`` way; an empty or already hidden value stays as it is."""
    if not value or is_hidden(value):
        return value
    return digest(value) if how == "digest" else MASK


def redact_url(text: str) -> str:
    """``scheme://user:pass@host`` → ``scheme://***@host``, anywhere in ``text``."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text) if "@" in text else text


def url_origin(url: str) -> str:
    """A URL as it may be shown: scheme and host (and port) only, the rest masked —
    ``https://bot:pw@chat.example/hooks/T0KEN`` → ``https://chat.example/***``.  The path of a
    chat's incoming webhook is its credential, and user:password never shows."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return MASK
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rpartition("@")[2]
    return f"{scheme}://{host}/{MASK}"


def redact_argv(argv: Sequence[str], how: How = "mask") -> list[str]:
    """The argv with credentials hidden: the values of credential options (``--api-key X``,
    ``--hf-token=X``), of credential variables set on the command line (``env HF_TOKEN=X vllm``),
    and credentials in URLs."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append(hide(tok, how))
            hide_next = False
            continue
        name, eq, value = tok.partition("=")
        if tok.startswith("-"):
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={hide(value, how)}")
                    continue
                hide_next = True
        elif eq and name.isidentifier() and is_secret_name(name):
            out.append(f"{name}={hide(value, how)}")
            continue
        out.append(redact_url(tok))
    return out


def redact_environment(env: Mapping[str, str], how: How = "mask") -> dict[str, str]:
    """``KEY=value`` pairs with the values of credential variables hidden (and URL credentials)."""
    return {k: hide(v, how) if is_secret_name(k) else redact_url(v) for k, v in env.items()}


def _quoted_mask(value: str) -> str:
    return value[0] + MASK + value[0] if value[:1] in ("'", '"') and len(value) > 1 else MASK


def _mask_named(pattern: re.Pattern[str], text: str) -> str:
    """Mask the value after each secret-named match of ``pattern`` (groups: name, separator)."""
    out: list[str] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() < pos or not is_secret_name(m.group(1)):
            continue
        v = _VALUE.match(text, m.end())
        if v is None or (m.group(2) != "=" and v.group().startswith("-")):  # "--api-key --port 1"
            continue
        at = v.start() + (v.group()[:1] in ("'", '"'))
        if text.startswith(MASK, at) or _DIGEST.match(text, at):  # hidden already (a digest shows a change)
            continue
        out += [text[pos : m.end()], _quoted_mask(v.group())]
        pos = v.end()
    return "".join(out) + text[pos:] if out else text


def _mask_member(m: re.Match[str]) -> str:
    """A JSON member or a Python dict item (``"api_key": "x"``, ``'api_key': ['x']``), masked."""
    if not is_secret_name(m.group(2)):
        return m.group(0)
    return m.group(1) + m.group(2) + m.group(1) + m.group(3) + f"{m.group(1)}{MASK}{m.group(1)}"


def _mask_listed(text: str) -> str:
    """An argv printed as a list (``["--api-key", "x"]``, ``['--token', 'x']``): each value after a
    secret-looking option masked."""
    out: list[str] = []
    pos = 0
    for m in _LISTED.finditer(text):
        if m.start() < pos or not is_secret_name(m.group(2)) or is_hidden(m.group(5)):
            continue
        out += [text[pos : m.start(5)], MASK]
        pos = m.end(5)
    return "".join(out) + text[pos:]


def redact_text(text: str) -> str:
    """Free text (a message, a reason, a log line) with every credential it shows masked."""
    if not _MAYBE.search(text):
        return text
    text = _mask_named(_ASSIGN_NAME, _mask_named(_OPTION_NAME, redact_url(text)))
    text = _JSON_MEMBER.sub(_mask_member, _mask_listed(text))
    return _AUTH.sub(lambda m: m.group(1) + m.group(2) + MASK, text)


def redact_tree(value: Any, how: How = "mask") -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every credential in it hidden.

    The value of a key with a secret-looking name (``HF_TOKEN``, ``api_key``) is hidden the ``how``
    way, and so are ``value``/``old``/``new`` beside a secret-looking ``name`` (a change in a diff);
    a list of strings is read as a command line (:func:`redact_argv`) and each of its words as text;
    every other string as text (:func:`redact_text`).  Other values are returned as they are.  A new
    object is returned; ``value`` is not changed.
    """
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (dict, Mapping)):
        named = value.get("name")
        secret_sibling = isinstance(named, str) and is_secret_name(named)
        out: dict[Any, Any] = {}
        for k, v in value.items():
            secret = isinstance(k, str) and (
                is_secret_name(k) or (secret_sibling and k in ("value", "old", "new"))
            )
            if secret and isinstance(v, str):
                out[k] = hide(v, how)
            else:
                out[k] = redact_tree(v, how)
        return out
    if isinstance(value, (list, tuple)):
        if _is_words(value):
            return [redact_text(t) for t in redact_argv(value, how)]
        return [redact_tree(v, how) for v in value]
    return value


def _is_words(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value)
