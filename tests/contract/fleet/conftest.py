"""Fixtures of the fleet's contract tests: a private PostgreSQL cluster (``tests/support/pgcluster.py``).

``pg`` is a started cluster of the test's own, stopped and removed after it whatever happens; when
the PostgreSQL server binaries are missing the fixture FAILS naming them (tests never skip).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_support import PASSWORD

from gpushift.config.mirror import MirrorConfig
from tests.support.pgcluster import PgCluster, PgMissing, private_cluster


@pytest.fixture
def pg() -> Iterator[PgCluster]:
    try:
        with private_cluster() as cluster:
            yield cluster
    except PgMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def mirror_config(pg: PgCluster, tmp_path: Path) -> MirrorConfig:
    """A database ``fleet`` of role ``gs`` (password in a file); small batches, quick retries."""
    url = pg.make_db("fleet", "gs", PASSWORD)
    (tmp_path / "pw").write_text(PASSWORD)
    return MirrorConfig(url=url, password_file=str(tmp_path / "pw"), batch_size=7, retry_s=0.1)
