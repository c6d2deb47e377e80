"""Many hosts, one record: every host's ledger mirrored into one PostgreSQL, and the fleet's view of it.

Modules, one job each (docs/fleet.md says what the central database holds and why):

* ``secret``  the mirror's password: from a file or a systemd credential, never from the config text;
* ``db``      one connection to the central database, with its deadlines (connect, statement);
* ``schema``  the central schema, created and migrated (additive only) under an advisory lock;
* ``central`` the rows as the central table holds them (pure: a local row → its central values);
* ``compare`` a local row against its central copy: the same, a known local change, or a mismatch (pure);
* ``local``   the host's own ledger rows, read on a read-only connection of the mirror's own;
* ``position`` what has been sent, under ``state_dir`` (``mirror.json``, replaced atomically);
* ``mirror``  the daemon's mirror thread: rows and the host's state, off the switch's path;
* ``queries`` what ``gpushift fleet`` reads (status, ledger), and ``verify`` the central chains (pure).
"""
