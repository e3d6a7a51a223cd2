"""`memctl db migrate --dry-run`: the plan says what each migration locks, and says it truthfully.

Each released migration (and each fix-up, on the memory it fixes) runs here in a transaction, and the locks its
session holds on tables that existed before it (pg_locks) are held against what the plan claims for it: what waits
(reads and writes, writes, nothing) may be overstated, never understated.
"""

from __future__ import annotations

import pytest

from memctl import db
from memctl.db import migrate
from memctl.upgrade import plan
from tests.fix_upgrade import fixture_records

HELD = """
SELECT c.relname AS name, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND l.granted AND c.relnamespace = current_schema()::regnamespace
  AND c.relkind IN ('r', 'p')
"""
TABLES = "SELECT relname AS name FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')"
WAITS = ("nothing", "writes", "reads and writes")


def _mode(lock_mode: str) -> str:
    """pg_locks' AccessExclusiveLock -> ACCESS EXCLUSIVE."""
    import re

    return " ".join(re.findall(r"[A-Z][a-z]+", lock_mode.removesuffix("Lock"))).upper()


def _claims(migration: migrate.Migration) -> dict[str, plan.Lock]:
    """Per table, the strongest lock the plan claims for the migration (a transaction holds each to its end)."""
    out: dict[str, plan.Lock] = {}
    for lock in (lock for s in migrate.statements(migration.steps()) for lock in plan.locks(s)):
        held = out.get(lock.table)
        if held is None or plan.MODES.index(lock.mode) > plan.MODES.index(held.mode):
            out[lock.table] = lock
    return out


def _held_against_claims(conn, migration: migrate.Migration) -> list[str]:
    """Run the migration in a transaction (recorded as the migrator records it); what it held beyond its claims."""
    existing = {r["name"] for r in conn.execute(TABLES).fetchall()}
    claims = _claims(migration)
    every = claims.get(plan.EVERY_TABLE)
    wrong = []
    with conn.transaction():
        conn.execute(migration.steps())
        held = conn.execute(HELD).fetchall()
        if migration.status == "fixup":
            conn.execute(migrate.RECORD_FIXUP, (migration.checksum, "test", migration.name))
        else:
            conn.execute(migrate.RECORD, (migration.name, migration.checksum, "test"))
    for row in held:
        if row["name"] not in existing:
            continue
        actual = plan.Lock(row["name"], _mode(row["mode"]))
        claimed = [c for c in (claims.get(row["name"]), every) if c is not None]
        best = max((WAITS.index(c.blocks) for c in claimed), default=-1)
        if WAITS.index(actual.blocks) > best:
            wrong.append(
                f"{migration.name}: {row['mode']} on {row['name']} ({actual.blocks} wait), the plan says "
                f"{[f'{c.mode} on {c.table}' for c in claimed] or 'nothing'}"
            )
    return wrong


def test_each_migrations_plan_claims_at_least_the_locks_it_takes(empty_db_url):
    wrong = []
    with db.connect(empty_db_url) as conn:
        conn.execute(migrate.CREATE_TABLE)
        for migration in migrate.read_files():
            assert not migration.sql.lstrip().startswith(migrate.NO_TRANSACTION), (
                "held locks are read in a transaction"
            )
            wrong += _held_against_claims(conn, migration)
    assert wrong == []


@pytest.mark.parametrize(
    "record",
    [r for r in fixture_records() if r["name"] in ("17705b6", "df4f8cc", "b86766e")],
    ids=lambda r: r["name"],
)
def test_each_fix_ups_plan_claims_at_least_the_locks_it_takes(record, restored):
    with db.connect(restored(record)) as conn:
        conn.execute(migrate.CREATE_TABLE)
        conn.execute(migrate.ADD_COLUMNS)
        fixups = [m for m in migrate.read_schema(conn).by("fixup")]
        assert fixups
        wrong = [w for m in fixups for w in _held_against_claims(conn, m)]
    assert wrong == []


def test_the_plan_of_a_memory_names_its_rows_and_what_waits(restored, cli, memctl_env):
    """--dry-run on a memory: each pending statement with its lock, rows and time; nothing changes."""
    record = next(r for r in fixture_records() if r["name"] == "1891a38")
    url = restored(record)
    env = {"MEMCTL_DATABASE_URL": url}
    steps = cli("db", "migrate", "--dry-run", "-f", "json", env=env)
    assert steps.exit_code == 0 and "a backup would be taken first" in steps.stderr
    rows = steps.json()
    assert {r["migration"] for r in rows} == {
        m for m in (f.name for f in migrate.read_files()) if m not in record["sql"]
    }
    rewrite = next(
        r
        for r in rows
        if r["migration"] == "0013_episode_path_words.sql"
        and r["table"] == "episodes"
        and "ADD COLUMN" in r["statement"]
    )
    assert rewrite["lock"] == "ACCESS EXCLUSIVE" and rewrite["blocks"] == "reads and writes"
    assert rewrite["rows"] >= 10
    with db.connect(url) as conn:
        assert {r["name"] for r in conn.execute("SELECT name FROM memctl_migrations")} == set(
            record["sql"]
        )
