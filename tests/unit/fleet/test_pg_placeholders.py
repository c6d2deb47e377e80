"""The fleet's SQL keeps DB-API ``%s`` placeholders; asyncpg takes ``$1, $2, ...`` (fleet/pg.py)."""

from __future__ import annotations

import pytest

from gpushift.fleet.pg import dollar


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        ("SELECT 1", "SELECT 1"),
        ("SELECT %s", "SELECT $1"),
        (
            "WHERE host = %s AND chain = %s AND id BETWEEN %s AND %s",
            "WHERE host = $1 AND chain = $2 AND id BETWEEN $3 AND $4",
        ),
        ("VALUES (%s, %s::jsonb)", "VALUES ($1, $2::jsonb)"),
        # %% is a literal percent sign (as psycopg and every DB-API driver with this style have it).
        ("SELECT format('%%I', %s::text)", "SELECT format('%I', $1::text)"),
        ("SELECT '100%%' || %s", "SELECT '100%' || $1"),
        # Any other % is left for the server.
        ("SELECT 7 % 3", "SELECT 7 % 3"),
    ],
)
def test_placeholders_are_numbered_in_order(sql: str, want: str) -> None:
    assert dollar(sql) == want


def test_a_repeated_statement_gives_the_same_text() -> None:
    sql = "SELECT %s, %s"
    assert dollar(sql) == dollar(sql) == "SELECT $1, $2"
