"""The deployment ledger (SQLite, a pending spool, a hash chain) and what ``gpushift ledger`` shows.

Modules, one job each:

* ``schema``  the SQL schema, its versions and migrations, opening the database;
* ``chain``   the row hash, the head file, verify;
* ``spool``   records the database could not take, under the runtime directory;
* ``rows``    a ``SwitchRecord`` as the values of a row, and back;
* ``files``   the private files beside the database (modes, group, atomic replacement);
* ``reader``  the read side: read-only connection, queries, verify;
* ``connection`` the writer's connection and its state (the base of ``SqliteLedger``);
* ``store``   ``SqliteLedger``, the ``Ledger`` port: writes that never lose a record;
* ``health``  the ledger's health as status shows it;
* ``diff``    what changed between two launches of a backend;
* ``reports`` what ``gpushift ledger`` shows beyond raw rows (list, the streamed JSON, exports),
  with ``show`` (one launch) and ``readme`` (the machine's deployment README);
* ``view``    the newest rows in memory, for status;
* ``text``    how ledger values read for a person (times, sizes, command lines).
"""

from __future__ import annotations

from gpushift.ledger.chain import GENESIS_HASH, VerifyResult, row_hash
from gpushift.ledger.rows import record_from_dict
from gpushift.ledger.schema import SCHEMA_VERSION, migrate, schema_version
from gpushift.ledger.spool import SPOOL_SUBDIR
from gpushift.ledger.store import SqliteLedger

__all__ = [
    "GENESIS_HASH",
    "SCHEMA_VERSION",
    "SPOOL_SUBDIR",
    "SqliteLedger",
    "VerifyResult",
    "migrate",
    "record_from_dict",
    "row_hash",
    "schema_version",
]
