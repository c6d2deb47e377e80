"""The doctor's table of backend kinds: the rules of every kind that has some.

Read from the one table of kinds (:data:`gpushift.backends.kinds.KINDS`: each kind's module says
its ``doctor`` rules).  A kind without rules (``generic``) is missing here: it gets only the common
rules, and its port is the health URL's.
"""

from __future__ import annotations

from gpushift.backends import kinds
from gpushift.backends.rules import KindRules as KindRules
from gpushift.backends.rules import no_stop_rules as no_stop_rules

KINDS: dict[str, KindRules] = {name: k.doctor for name, k in kinds.KINDS.items() if k.doctor is not None}
