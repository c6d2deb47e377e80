"""Fixtures of the fleet's contract tests: a private PostgreSQL cluster (``tests/support/pgcluster.py``).

``pg`` is a started cluster of the test's own, stopped and removed after it whatever happens; when
the PostgreSQL server binaries are missing the fixture FAILS naming them (tests never skip).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pgcluster import PgCluster, PgMissing, private_cluster


@pytest.fixture
def pg() -> Iterator[PgCluster]:
    try:
        with private_cluster() as cluster:
            yield cluster
    except PgMissing as e:
        pytest.fail(str(e), pytrace=False)
