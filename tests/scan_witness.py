"""What each vector statement of a search ran under, read on its own connection (tests/test_search.py, and on a
cluster tests/test_cluster.py)."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

# The HNSW scan settings in force, read on the search's connection inside its transaction.
SCAN_NOW = (
    "SELECT current_setting('hnsw.ef_search') AS ef, current_setting('hnsw.iterative_scan') AS scan"
)


def scan_witness(conn, probe: str | sql.Composable = SCAN_NOW) -> list[list[dict]]:
    """From now on, after each statement on `conn` that compares vectors (`<=>`), the rows of `probe`
    run right after it on the same connection, in the same transaction: the settings that statement ran under.
    """
    seen: list[list[dict]] = []

    class Witnessed(psycopg.Cursor):
        def execute(self, query, params=None, **kwargs):
            result = super().execute(query, params, **kwargs)
            text = (
                query.as_string(self.connection)
                if isinstance(query, sql.Composable)
                else str(query)
            )
            if "<=>" in text:
                seen.append(
                    psycopg.Cursor(self.connection, row_factory=dict_row).execute(probe).fetchall()
                )
            return result

    conn.cursor_factory = Witnessed
    return seen
