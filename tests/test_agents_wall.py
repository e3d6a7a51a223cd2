"""The red team: bob's own SQL, in a session whose user is his agent's role, against alice's rows.

Each attack of ATTACKS changes bob's session first (temporary objects named as every helper's table,
functions and operators in pg_temp, search_path, every role he may become, large objects, advisory and
table locks, ...); then the same checks run in it: no read returns any of alice's marks, no count sees
more than bob's own rows, no write changes a row (refused, or 0 rows), and, with bob's transaction still
open, alice's writes (through memctl, in her role) and the owner's go through. Every attack runs in both
kinds of session: bob's login role (`agent add --login`), and SET SESSION AUTHORIZATION from a superuser
(skipped, saying so, without one). `SET ROLE` from the owner proves nothing (RESET ROLE undoes it), so no
attack starts from it.

CI runs this on the embedded PostgreSQL 18 (a superuser owner) and on Debian's PostgreSQL 15 with
CREATEROLE's unprivileged owner, where memctl may not revoke what only a superuser may (large objects,
advisory locks: memctl.db.wall.gaps): there, those attacks succeed at what they do and still reach
nothing of alice's.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from memctl import config, db
from memctl.db import migrate
from memctl.mcp import sessions, tools
from memctl.records import facts
from memctl.write import repeats


# The tables the SECURITY DEFINER functions read, and the memory tables: a temporary table of each name, holding a
# row that would make bob alice (columns of the registry, the fold key, the blocked sources and the catalog).
SHADOWED = (
    "agents",
    "fold_key",
    "blocked_sources",
    "episodes",
    "facts",
    "fact_history",
    "chunks",
    "pg_roles",
    "pg_auth_members",
    "memctl_lock_keys",
    "memctl_lock_models",
    "memctl_lock_sources",
)
SHADOW = (
    "CREATE TEMP TABLE {t} AS SELECT 'ALICE'::text AS name, 'BOB_ROLE'::name AS role_name, "
    "'ALICE_NS'::text AS writes_namespace, ARRAY['ALICE_NS']::text[] AS reads_namespaces, false AS read_only, "
    "'ALICE'::text AS agent, 'ALICE_NS'::text AS namespace, 'BOB_ROLE'::name AS rolname, "
    "'\\x00'::bytea AS key, 'x'::text AS source"
)
FAKES = (
    "memctl_agent_of(name) RETURNS text",
    "memctl_agent_writer(name) RETURNS text",
    "memctl_agent_reads(name) RETURNS text[]",
    "memctl_agent_writes(name) RETURNS text",
    "current_setting(text) RETURNS text",
    "pg_has_role(name, oid, text) RETURNS boolean",
)
ANSWER = {"text": "'ALICE'", "text[]": "ARRAY['ALICE_NS']", "boolean": "true"}
TEMP_FIRST = (
    "SELECT set_config('search_path', 'pg_temp, ' || current_setting('search_path'), false)"
)
GROUPS = ("memctl_agents", "memctl_agents_write")
MODES = (
    "login",
    "authorization",
)  # bob's login role; SET SESSION AUTHORIZATION by a superuser (fix_agents)


@dataclass(frozen=True)
class Attack:
    name: str
    setup: tuple[str, ...] = ()
    login_only: bool = (
        False  # changes the session's authorization, which a superuser's session may undo
    )


def _fakes(schema: str) -> tuple[str, ...]:
    return tuple(
        f"CREATE FUNCTION {schema}.{signature} LANGUAGE sql AS $$ SELECT {ANSWER[signature.split()[-1]]} $$"
        for signature in FAKES
    )


ATTACKS = (
    Attack("plain"),
    *(Attack(f"temp table {t}", (SHADOW.format(t=t), TEMP_FIRST)) for t in SHADOWED),
    Attack("temp functions", (*_fakes("pg_temp"), TEMP_FIRST)),
    Attack(
        "functions in memctl's schema",
        tuple(
            f"DO $do$ BEGIN EXECUTE format('{s.replace(chr(39), chr(39) * 2)}', "
            "current_schema()); END $do$"
            for s in _fakes("%I")
        ),
    ),
    Attack(
        "operators",
        (
            "CREATE FUNCTION pg_temp.yes(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
            "CREATE OPERATOR pg_temp.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_temp.yes)",
            "DO $$ BEGIN EXECUTE format('CREATE OPERATOR %I.= (LEFTARG = text, RIGHTARG = text, "
            "FUNCTION = pg_catalog.textne)', current_schema()); END $$",
            TEMP_FIRST,
        ),
    ),
    Attack("search_path", ("SET search_path = pg_temp", "SET search_path = pg_catalog")),
    *(Attack(f"SET ROLE {g}", (f"SET ROLE {g}",)) for g in GROUPS),
    *(
        Attack(f"set_config role {g}", (f"SELECT set_config('role', '{g}', false)",))
        for g in GROUPS
    ),
    Attack("SET ROLE alice", ("SET ROLE ALICE_ROLE",)),
    Attack(
        "SET SESSION AUTHORIZATION alice",
        ("SET SESSION AUTHORIZATION ALICE_ROLE",),
        login_only=True,
    ),
    Attack("row_security off", ("SET row_security = off",)),
    Attack("large objects", ("SELECT lo_creat(-1)", "SELECT lo_from_bytea(0, 'x')")),
    Attack(
        "views",
        (
            "CREATE TEMP VIEW every AS SELECT * FROM episodes",
            "DO $$ BEGIN EXECUTE format('CREATE VIEW %I.every AS SELECT * FROM episodes', current_schema()); "
            "END $$",
        ),
    ),
    Attack(
        "owner's powers",
        (
            "ALTER TABLE episodes DISABLE ROW LEVEL SECURITY",
            "ALTER ROLE BOB_ROLE BYPASSRLS",
            "CREATE POLICY everything ON episodes USING (true)",
            "SELECT memctl_grant_all()",
            "GRANT memctl_agents TO BOB_ROLE",
            "ALTER TABLE episodes OWNER TO BOB_ROLE",
        ),
    ),
    Attack(
        "memctl's advisory keys",
        (
            "SELECT pg_advisory_lock(hashtext('memctl.embedding_models'))",
            "SELECT pg_advisory_lock(hashtext('memctl.blocked_sources'))",
            f"SELECT pg_advisory_lock({repeats.LOCK_CLASS}, hashtext('ALICE'))",  # the keys before sql/0023
            f"SELECT pg_advisory_lock({repeats.IMPORT_CLASS}, 0)",
            "SELECT pg_advisory_lock(hashtextextended('ALICE_NS' || chr(31) || 'db.password.hint', 0))",
            f"SELECT pg_advisory_xact_lock({repeats.LOCK_CLASS}, hashtext('ALICE'))",
            f"SELECT pg_advisory_lock({migrate.LOCK_KEY})",
        ),
    ),
    Attack(
        "memctl's locks",
        (
            "SELECT memctl_lock('models', false)",
            "SELECT memctl_lock('sources', false)",
            f"SELECT memctl_lock_key({repeats.LOCK_CLASS}, 'ALICE')",
            f"SELECT memctl_lock_key({repeats.IMPORT_CLASS}, '')",
            f"SELECT memctl_lock_key({facts.LOCK_CLASS}, 'ALICE_NS' || chr(31) || 'db.password.hint')",
            "LOCK TABLE memctl_lock_models IN ACCESS EXCLUSIVE MODE",
            "LOCK TABLE memctl_lock_keys IN ACCESS EXCLUSIVE MODE",
            "SELECT * FROM memctl_lock_keys FOR UPDATE",
        ),
    ),
    Attack(
        "table locks",
        (
            "LOCK TABLE episodes IN ACCESS EXCLUSIVE MODE",
            "LOCK TABLE facts IN EXCLUSIVE MODE",
            "LOCK TABLE chunks IN SHARE ROW EXCLUSIVE MODE",
            "LOCK TABLE fact_history IN SHARE MODE",
            "SELECT * FROM episodes FOR UPDATE",
            "SELECT * FROM facts FOR UPDATE",
        ),
    ),
)

# Reads: none may return one of alice's marks (her text, her fact's value, her namespace).
READS = (
    "SELECT agent, content FROM episodes",
    "SELECT agent, content FROM chunks",
    "SELECT namespace, key, value FROM facts",
    "SELECT namespace, key, old_value, new_value FROM fact_history",
    "SELECT * FROM agents",
    "SELECT * FROM fold_key",
    "SELECT * FROM blocked_sources",
    "SELECT id FROM episodes WHERE tsv @@ to_tsquery('HERON')",
    "SELECT memctl_agent_reads('ALICE_ROLE'), memctl_agent_writes('ALICE_ROLE'), memctl_agent_of('ALICE_ROLE'), "
    "memctl_agent_writer('ALICE_ROLE')",
    "SELECT memctl_agent_matches(to_tsquery('HERON'))",
    "SELECT memctl_fold_key()",
    "SELECT last_value FROM episodes_id_seq",
    "SELECT most_common_vals::text, histogram_bounds::text FROM pg_stats WHERE tablename IN "
    "('episodes', 'chunks', 'facts', 'fact_history')",
    "COPY episodes TO STDOUT",
    "COPY (SELECT content FROM episodes) TO STDOUT",
    "COPY facts TO STDOUT",
)
COUNTS = {
    "episodes": "SELECT count(*) FROM episodes",
    "chunks": "SELECT count(*) FROM chunks",
    "facts": "SELECT count(*) FROM facts",
    "fact_history": "SELECT count(*) FROM fact_history",
}
# Writes: each refused, or changing no row (bob's own session writes nothing, not even his own rows).
WRITES = (
    "INSERT INTO episodes (agent, content, content_hash, importance) VALUES ('ALICE', 'bob was here', '\\x00', 5)",
    "INSERT INTO episodes (agent, content, content_hash, importance) VALUES ('BOB', 'bob was here', '\\x00', 5)",
    "UPDATE episodes SET importance = 0",
    "UPDATE episodes SET content = 'bob was here' WHERE agent = 'ALICE'",
    "UPDATE facts SET value = 'bob was here'",
    "INSERT INTO facts (namespace, key, value, version) VALUES ('ALICE_NS', 'k', 'bob was here', 9)",
    "DELETE FROM episodes",
    "DELETE FROM facts",
    "TRUNCATE episodes",
    "TRUNCATE facts",
    "INSERT INTO blocked_sources (source) VALUES ('mcp:ALICE')",
    "UPDATE fold_key SET key = '\\x00'",
    "UPDATE agents SET role_name = 'BOB_ROLE'",
)
COPY_IN = "COPY episodes (agent, content, content_hash, importance) FROM STDIN"


def _sql(text: str, wall) -> str:
    for token, value in (
        ("ALICE_ROLE", wall.alice.role),
        ("BOB_ROLE", wall.bob.role),
        ("ALICE_NS", wall.alice.namespace),
        ("HERON", wall.marks[0]),
        ("ALICE", wall.alice.name),
        ("BOB", wall.bob.name),
    ):
        text = text.replace(token, value)
    return text


def _try(conn, statement: str):
    """Run one statement of bob's in a savepoint: (rows or None, rowcount, error or None)."""
    try:
        with conn.transaction():
            if statement.startswith("COPY") and "TO STDOUT" in statement:
                with conn.cursor().copy(statement) as copy:
                    return [bytes(block) for block in copy], -1, None
            cur = conn.execute(statement)
            return (cur.fetchall() if cur.description else None), cur.rowcount, None
    except psycopg.Error as exc:
        return None, 0, exc


def _copy_in(conn, wall) -> int:
    try:
        with conn.transaction():
            with conn.cursor().copy(COPY_IN) as copy:
                copy.write_row((wall.alice.name, "bob copied this", b"\x00", 5))
            return 1
    except psycopg.Error:
        return 0


def _snapshot(wall) -> list:
    with wall.owner() as conn:
        return [
            conn.execute(
                "SELECT id, agent, content, importance, repeats FROM episodes WHERE agent = %s ORDER BY id",
                (wall.alice.name,),
            ).fetchall(),
            conn.execute(
                "SELECT key, value, version FROM facts WHERE namespace = %s ORDER BY key",
                (wall.alice.namespace,),
            ).fetchall(),
            conn.execute(
                "SELECT count(*) AS n FROM fact_history WHERE namespace = %s",
                (wall.alice.namespace,),
            ).fetchone(),
        ]


def _alice_writes(wall) -> None:
    """alice remembers and sets a fact through memctl in her role, and the owner adds an episode for her, each
    failing rather than waiting past 10 s for a lock bob's open transaction might hold."""

    def opened():
        conn = db.connect(wall.url, vector=True)
        conn.execute("SET lock_timeout = '10s'")
        return conn

    scope = sessions.Scope.make(agent=wall.alice.name, namespace=wall.alice.namespace)
    session = sessions.Session(config.Settings(), scope, opened, role=wall.alice.role)
    try:
        assert tools.remember(session, "alice's write while bob holds his session open").data[
            "stored"
        ]
        tools.fact_set(session, "written.while.held", "yes")
    finally:
        session.close()
    with opened() as conn:
        facts.set_fact(conn, "written.by.owner", "yes", namespace=wall.alice.namespace)


def _undo_alice_writes(wall) -> None:
    with wall.owner() as conn:
        conn.execute(
            "DELETE FROM episodes WHERE agent = %s AND content LIKE 'alice''s write while%%'",
            (wall.alice.name,),
        )
        for key in ("written.while.held", "written.by.owner"):
            conn.execute(
                "DELETE FROM facts WHERE namespace = %s AND key = %s", (wall.alice.namespace, key)
            )
            conn.execute(
                "DELETE FROM fact_history WHERE namespace = %s AND key = %s",
                (wall.alice.namespace, key),
            )


def _leaks(rows, wall) -> list[str]:
    shown = repr(rows)
    found = [mark for mark in wall.marks if mark in shown]
    if rows and any(isinstance(v, list) and set(v) & wall.alice_ids for row in rows for v in row):
        found.append("alice's episode ids")
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_bob_gets_past_his_rows_by_no_postgresql_feature(wall, mode, attack):
    if attack.login_only and mode != "login":
        pytest.skip(
            "a superuser's session may undo SET SESSION AUTHORIZATION: only bob's login tries it"
        )
    before = _snapshot(wall)
    problems = []
    with wall.session(mode, wall.bob) as conn:
        for statement in attack.setup:
            _try(conn, _sql(statement, wall))  # refused or not: what follows must hold either way
        for statement in READS:
            rows, _, _ = _try(conn, _sql(statement, wall))
            problems += [f"read {statement!r} shows {leak}" for leak in _leaks(rows, wall)]
        for table, statement in COUNTS.items():
            rows, _, _ = _try(conn, statement)
            if rows and rows[0][0] > wall.bob_counts[table]:
                problems.append(
                    f"{statement!r} counts {rows[0][0]} rows, bob has {wall.bob_counts[table]}"
                )
        for statement in WRITES:
            _, changed, error = _try(conn, _sql(statement, wall))
            if error is None and changed:
                problems.append(f"{statement!r} changed {changed} row(s)")
        if _copy_in(conn, wall):
            problems.append("COPY FROM wrote a row")
        try:
            _alice_writes(wall)  # bob's transaction, with whatever it took, is still open
        except Exception as exc:  # noqa: BLE001 - any failure here is bob blocking alice
            problems.append(f"alice's writes failed while bob's session was open: {exc}")
    _undo_alice_writes(wall)
    assert _snapshot(wall) == before, "alice's rows changed"
    assert problems == [], problems


@pytest.mark.parametrize("mode", MODES)
def test_no_role_bob_is_a_member_of_shows_alices_rows(wall, mode):
    """Every role bob's role is a member of (found on the server, not listed), assumed in turn: nothing of alice's."""
    with wall.owner() as conn:
        roles = [
            r["rolname"]
            for r in conn.execute(
                "SELECT rolname FROM pg_roles WHERE pg_has_role(%s, oid, 'MEMBER') AND rolname <> %s",
                (wall.bob.role, wall.bob.role),
            )
        ]
    assert set(GROUPS) <= set(roles)
    seen = {}
    with wall.session(mode, wall.bob) as conn:
        for role in roles:
            _try(conn, sql.SQL("SET ROLE {}").format(sql.Identifier(role)).as_string(conn))
            for statement in READS[:4]:
                rows, _, _ = _try(conn, statement)
                if _leaks(rows, wall):
                    seen[role] = statement
            _try(conn, "RESET ROLE")
    assert seen == {}


def test_every_function_of_memctls_is_pinned_and_none_is_publics(wall):
    """From the catalog: every SECURITY DEFINER function of memctl's schema pins search_path with pg_temp last, and
    no function of memctl's may be executed by PUBLIC (the roles that need one are granted it)."""
    with wall.owner() as conn:
        rows = conn.execute("""
            SELECT p.proname, p.prosecdef, p.proconfig,
                   has_function_privilege('public', p.oid, 'EXECUTE') AS public
            FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'memctl\\_%'
              AND p.proname <> 'memctl_test_writer_check'""").fetchall()
        schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
    assert {r["proname"] for r in rows} >= {
        "memctl_agent_of",
        "memctl_agent_matches",
        "memctl_fold_key",
        "memctl_lock",
    }
    for row in rows:
        assert not row["public"], f"{row['proname']} is PUBLIC's"
        if row["prosecdef"]:
            path = [
                setting for setting in row["proconfig"] or [] if setting.startswith("search_path=")
            ]
            assert path, f"{row['proname']} has no search_path of its own"
            parts = [p.strip().strip('"') for p in path[0].split("=", 1)[1].split(",")]
            assert parts[-1] == "pg_temp" and schema in parts and "pg_catalog" in parts, (
                row["proname"],
                parts,
            )
