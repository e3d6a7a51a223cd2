"""`memctl db migrate --dry-run`: what each pending migration locks, what that holds up, for how long.

Each statement of each pending file (or fix-up) is read for the lock PostgreSQL takes on an existing table
and for the work done under it, from the statement's form as PostgreSQL's documentation gives it
("Explicit Locking", and each command's page):
- ACCESS EXCLUSIVE (ALTER TABLE, DROP, CREATE POLICY, row-level security): reads and writes wait;
- SHARE ROW EXCLUSIVE (CREATE TRIGGER, a foreign key) and SHARE (CREATE INDEX): writes wait;
- SHARE UPDATE EXCLUSIVE (CREATE INDEX CONCURRENTLY, VALIDATE CONSTRAINT) and ROW EXCLUSIVE (INSERT,
  UPDATE, DELETE): nothing waits but a write to the same row.
Code (a DO block, a function called by SELECT) may lock any table: it is shown against every table, the
strongest lock. tests/test_upgrade_plan.py holds each migration's plan against the locks it really takes.

How long: the rows a statement works through (the table's row estimate, pg_class.reltuples) at the rate
measured for that work (tests/bench/upgrade.py, docs/benchmarks.md); a statement without such work takes a
moment once it has its lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memctl.db import migrate

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# Lock modes, weakest first.
MODES = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)
EVERY_TABLE = "*"
# Seconds per row of each kind of work, measured by tests/bench/upgrade.py on 2 cores (docs/benchmarks.md).
RATES = {
    "index": 1.2e-6,
    "gin": 1.2e-5,
    "hnsw": 2e-4,
    "rewrite": 1e-5,
    "generated": 2.5e-5,
    "scan": 3e-7,
    "rows": 1e-5,
}
ROWS = """
SELECT c.relname AS name, CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END AS rows
FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
"""
COUNT = "SELECT count(*) AS n FROM {}"
_IDENT = r'(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\.(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*))?'
_ONLY = r"(?:ONLY\s+)?(?:IF\s+EXISTS\s+)?"


@dataclass
class Lock:
    table: str | None  # a table's name, or EVERY_TABLE (None: a statement whose table was not read)
    mode: str
    work: str | None = (
        None  # a key of RATES: what is done for each of the table's rows under the lock
    )

    @property
    def blocks(self) -> str:
        level = MODES.index(self.mode)
        if level >= MODES.index("ACCESS EXCLUSIVE"):
            return "reads and writes"
        if level >= MODES.index("SHARE"):
            return "writes"
        return "nothing"


@dataclass
class Step:
    migration: str
    action: str  # apply | fix-up
    statement: str
    lock: Lock | None
    rows: int | None = None
    seconds: float | None = None

    def to_dict(self) -> dict:
        expected = (
            "a moment"
            if self.seconds is None or self.seconds < 1
            else f"~{_duration(self.seconds)}"
        )
        return {
            "migration": self.migration,
            "action": self.action,
            "table": self.lock.table if self.lock else None,
            "lock": self.lock.mode if self.lock else None,
            "blocks": self.lock.blocks if self.lock else "nothing",
            "rows": self.rows,
            "expected": expected,
            "statement": self.statement,
        }


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _name(identifier: str) -> str:
    """A table as the statement spells it, without schema or quotes."""
    return identifier.rsplit(".", 1)[-1].strip('"')


def _first(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text, re.IGNORECASE | re.DOTALL)
    return _name(match.group(1)) if match else None


def _strip(statement: str) -> str:
    """The statement without comments, on one line."""
    return re.sub(
        r"\s+", " ", re.sub(r"--[^\n]*|/\*.*?\*/", " ", statement, flags=re.DOTALL)
    ).strip()


def locks(statement: str) -> list[Lock]:
    """The locks a statement takes on tables that exist before it (a table it creates is nobody's yet)."""
    text = _strip(statement)
    head = text.upper()
    if re.match(r"CREATE (UNIQUE )?INDEX", head):
        table = _first(rf"\bON\s+{_ONLY}({_IDENT})", text)
        using = re.search(r"\bUSING\s+(\w+)", text, re.IGNORECASE)
        work = {"gin": "gin", "hnsw": "hnsw"}.get(using.group(1).lower() if using else "", "index")
        mode = "SHARE UPDATE EXCLUSIVE" if " CONCURRENTLY " in f" {head} " else "SHARE"
        return [Lock(table, mode, work)] if table else []
    if head.startswith("ALTER TABLE"):
        return _alter_table(text)
    if re.match(r"(CREATE|DROP) (POLICY|TRIGGER|RULE)|CREATE OR REPLACE (TRIGGER|RULE)", head):
        table = _first(rf"\bON\s+{_ONLY}({_IDENT})", text)
        mode = (
            "SHARE ROW EXCLUSIVE"
            if "TRIGGER" in head.split(" ON ")[0] and head.startswith("CREATE")
            else "ACCESS EXCLUSIVE"
        )
        return [Lock(table, mode)] if table else []
    if re.match(r"DROP INDEX CONCURRENTLY", head):
        return [Lock(EVERY_TABLE, "SHARE UPDATE EXCLUSIVE")]
    if re.match(r"DROP (TABLE|INDEX|VIEW)", head):
        return [
            Lock(
                EVERY_TABLE
                if head.startswith("DROP INDEX")
                else _first(rf"^DROP \w+ {_ONLY}({_IDENT})", text),
                "ACCESS EXCLUSIVE",
            )
        ]
    if head.startswith("TRUNCATE"):
        return [Lock(_first(rf"^TRUNCATE (?:TABLE )?{_ONLY}({_IDENT})", text), "ACCESS EXCLUSIVE")]
    if re.match(r"(WITH .*?\)\s*)?(UPDATE|DELETE FROM|INSERT INTO)\b", head):
        table = _first(rf"\b(?:UPDATE|DELETE\s+FROM|INSERT\s+INTO)\s+{_ONLY}({_IDENT})", text)
        return [Lock(table, "ROW EXCLUSIVE", "rows")] if table else []
    if head.startswith("CREATE TABLE"):
        return [Lock(t, "SHARE ROW EXCLUSIVE") for t in _references(text)]
    if re.match(r"(DO\b|SELECT\b|CALL\b)", head):
        return [] if re.match(r"SELECT [^()]*$", head) else [Lock(EVERY_TABLE, "ACCESS EXCLUSIVE")]
    if re.match(r"COMMENT ON (TABLE|COLUMN) ", head):
        parts = [p.strip('"') for p in text.split()[3].split(".")]
        return [
            Lock(
                parts[-1] if head.startswith("COMMENT ON TABLE") else parts[-2],
                "SHARE UPDATE EXCLUSIVE",
            )
        ]
    return []  # functions, grants, settings, extensions, a new table without references


def _references(text: str) -> list[str]:
    return sorted(
        {_name(m) for m in re.findall(rf"\bREFERENCES\s+({_IDENT})", text, re.IGNORECASE)}
    )


def _alter_table(text: str) -> list[Lock]:
    table = _first(rf"^ALTER TABLE {_ONLY}({_IDENT})", text)
    if table is None:
        return []
    upper = text.upper()
    references = [Lock(t, "SHARE ROW EXCLUSIVE") for t in _references(text) if t != table]
    if re.search(r"\bVALIDATE CONSTRAINT\b", upper) and not re.search(
        r"\b(ADD|DROP|ALTER|RENAME)\b", upper
    ):
        return [Lock(table, "SHARE UPDATE EXCLUSIVE", "scan")] + references
    if re.search(r"\bGENERATED ALWAYS AS\b.*\bSTORED\b", upper):
        work = "generated"
    elif re.search(r"\b(SET DATA TYPE|ALTER COLUMN \S+ TYPE)\b", upper):
        work = "rewrite"
    elif (
        re.search(r"\bSET NOT NULL\b|\bCHECK\s*\(|\bFOREIGN KEY\b", upper)
        and "NOT VALID" not in upper
    ):
        work = "scan"
    elif re.search(r"\bADD (CONSTRAINT \S+ )?(UNIQUE|PRIMARY KEY)\b", upper):
        work = "index"
    else:
        work = None
    return [Lock(table, "ACCESS EXCLUSIVE", work)] + references


def _rows(conn: Memory) -> dict[str, int | None]:
    return {row["name"]: row["rows"] for row in conn.execute(ROWS).fetchall()}


def _count(conn: Memory, table: str | None, known: dict[str, int | None]) -> int | None:
    """The table's row estimate; counted when the table was never analysed; None for a table not there yet."""
    from psycopg import sql

    if table not in known:
        return None
    if known[table] is None:
        known[table] = conn.one(sql.SQL(COUNT).format(sql.Identifier(table)))["n"]
    return known[table]


def make(conn: Memory, todo: list[migrate.Migration]) -> list[Step]:
    """The plan of the migrations `todo` (memctl.db.migrate.pending) on this database."""
    known = _rows(conn)
    steps = []
    for migration in todo:
        action = "fix-up" if migration.status == "fixup" else "apply"
        for statement in migrate.statements(migration.steps()):
            shown = _strip(statement)
            shown = shown if len(shown) <= 100 else shown[:97] + "..."
            found = locks(statement)
            if not found:
                steps.append(Step(migration.name, action, shown, None))
            for lock in found:
                rows = None if lock.table == EVERY_TABLE else _count(conn, lock.table, known)
                seconds = rows * RATES[lock.work] if rows is not None and lock.work else None
                steps.append(Step(migration.name, action, shown, lock, rows, seconds))
    return steps
