"""Fixtures of the export and import tests: a second database to import into, and what the two hold.
Loaded through pytest_plugins (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import fresh_database


@pytest.fixture
def other_db(pg_server):
    """A second fresh, migrated database (the import target)."""
    with fresh_database(pg_server, "memctl_t2") as url:
        yield url


def counts(url: str) -> dict:
    from memctl import db

    with db.connect(url) as conn:
        return conn.execute(
            "SELECT (SELECT count(*) FROM episodes) AS episodes, (SELECT count(*) FROM chunks) AS chunks,"
            " (SELECT count(*) FROM facts) AS facts, (SELECT count(*) FROM fact_history) AS history,"
            " (SELECT count(*) FROM blocked_sources) AS blocked, (SELECT count(*) FROM embed_queue) AS queued,"
            " (SELECT count(*) FROM embedding_models) AS models"
        ).fetchone()


def records(text: str, kind: str) -> list[dict]:
    return [r for r in map(json.loads, text.splitlines()) if r["type"] == kind]
