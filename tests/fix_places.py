"""Fixtures over memctl.places: where a text is still held, and whether a plain digest of it is.

`places_of(conn)` answers for the catalog itself (every table of memctl's schema, every column read as text), not
only for what the declaration names, so a place the declaration forgot is looked at too.
"""

from __future__ import annotations

import hashlib

import pytest
from psycopg import sql

COLUMNS = """
SELECT c.relname AS table, a.attname AS column, pg_catalog.format_type(a.atttypid, NULL) AS type
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""
# The tables the catalog says hold an agent's rows: those with an agent or a namespace column, as
# sql/0019 and sql/0023 find them (the registry aside); memctl.places.AGENT_TABLES declares them.
AGENT_TABLES = """
SELECT c.relname AS name FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
  AND c.relname <> 'agents'
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid
              AND a.attname IN ('agent', 'namespace') AND NOT a.attisdropped)
ORDER BY 1
"""
TEXT_TYPES = (
    "text",
    "text[]",
    "character varying",
    "character",
    "json",
    "jsonb",
    "tsvector",
    "bytea",
    "name",
)


class Places:
    def __init__(self, conn):
        self.conn = conn

    def columns(self) -> list[dict]:
        """Every column of every table of memctl's schema, with its type."""
        return self.conn.execute(COLUMNS).fetchall()

    def agent_tables(self) -> list[str]:
        """Every table of memctl's schema with an agent or a namespace column (vector tables
        too)."""
        return [row["name"] for row in self.conn.execute(AGENT_TABLES)]

    def holding(self, text: str) -> list[str]:
        """table.column of every place whose value, read as text, contains TEXT (bytea as hex)."""
        found = []
        for col in (c for c in self.columns() if c["type"] in TEXT_TYPES):
            query = sql.SQL("SELECT count(*) AS n FROM {t} WHERE strpos({c}::text, %s) > 0").format(
                t=sql.Identifier(col["table"]), c=sql.Identifier(col["column"])
            )
            if self.conn.execute(query, (text,)).fetchone()["n"]:
                found.append(f"{col['table']}.{col['column']}")
        return found

    def plain_digests(self, *texts: str) -> list[str]:
        """table.column of every bytea place holding a plain sha256 of one of TEXTS (or its 16-byte prefix)."""
        digests = [hashlib.sha256(t.encode()).digest() for t in texts]
        found = []
        for col in (c for c in self.columns() if c["type"] == "bytea"):
            query = sql.SQL(
                "SELECT count(*) AS n FROM {t} WHERE {c} = ANY(%s) OR substr({c}, 1, 16) = ANY(%s)"
            ).format(t=sql.Identifier(col["table"]), c=sql.Identifier(col["column"]))
            if self.conn.execute(query, (digests, [d[:16] for d in digests])).fetchone()["n"]:
                found.append(f"{col['table']}.{col['column']}")
        return found


@pytest.fixture
def places_of():
    return Places
