"""L2: what counts as a secret, and how it is hidden — the one home of the secret patterns.

A name is secret-looking when its last word says so: ``--api-key``, ``--hf-token``, ``HF_TOKEN``,
``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``, ``GOOGLE_APPLICATION_CREDENTIALS``.  The same pattern
serves command-line option names and environment variable names.  Only the last word counts:
vLLM's ``--max-num-batched-tokens`` and ``--ssl-keyfile`` are not credentials.

Two ways to hide a value: :data:`MASK` where only its presence matters (a command line shown to a
person), :func:`digest` where a reader must still see that it changed (the ledger's diff).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

SECRET_NAME = re.compile(r"(?:^|[-_])(?:key|token|secret|passw(?:or)?d|credentials?)$", re.I)

MASK = "***"


def is_secret_name(name: str) -> bool:
    """True for an option or variable name that carries a credential."""
    return SECRET_NAME.search(name.lstrip("-")) is not None


def digest(value: str) -> str:
    """A short, stable stand-in for a secret value: equal values give equal digests."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16] + " (redacted)"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The argv with the values of credential options (``--api-key``, ``--hf-token``…) masked."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if tok.startswith("-"):
            name, eq, _value = tok.partition("=")
            if is_secret_name(name):
                if eq:
                    out.append(f"{name}={MASK}")
                    continue
                hide_next = True
        out.append(tok)
    return out
