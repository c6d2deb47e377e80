"""Shared by every test directory: the hypothesis profile.

Property tests run with a fixed seed (``derandomize``: the same examples on every run and every
machine, so a red CI run is red again locally) and keep no example database in the checkout.
``HYPOTHESIS_PROFILE=explore`` runs them with random seeds and more examples, to look for new
failures by hand.
"""

from __future__ import annotations

import os

try:
    from hypothesis import settings
except ModuleNotFoundError as e:  # a missing dependency fails, with what is missing
    raise ModuleNotFoundError("the tests need hypothesis (pip install -e '.[test]', or `make venv`)") from e

settings.register_profile("gpushift", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, database=None, deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpushift"))
