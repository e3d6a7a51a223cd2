"""Agents as principals: registry, roles, tokens, and row-level security that the database keeps.

Every check here runs against the real test server. Where a test needs to make roles and the test role
may not and no role that may is given (MEMCTL_TEST_CREATEROLE_URL), it is skipped, saying so.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from memctl import config
from memctl.records import agents, episodes, facts
from memctl.write.values import WRITER


@pytest.fixture
def db_url(agents_db_url):
    """An owner that may make agents' roles: the test role where it may, else the CREATEROLE role's
    (CI step 3: memctl_dba; tests/test_agents_owner.py tests the owner without CREATEROLE)."""
    return agents_db_url


def _as(conn, agent: str):
    """The connection in agent's role, as `psql` would be after SET ROLE."""
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(agents.role_name_for(agent))))
    return conn


def _seed(conn):
    settings = config.load()
    conn.use_settings(settings)
    mine = episodes.add(conn, "alice saw the heron queue back up", agent="alice")
    theirs = episodes.add(conn, "bob saw the heron queue back up", agent="bob")
    facts.set_fact(conn, "db.host", "10.0.0.1", namespace="alice")
    facts.set_fact(conn, "db.host", "10.0.0.2", namespace="bob")
    facts.set_fact(conn, "dns", "1.1.1.1", namespace="infra")
    return mine, theirs


def test_role_names_are_derived_and_fit():
    assert agents.role_name_for("alice") == "memctl_agent_alice"
    odd = agents.role_name_for("Deploy-Bot")
    assert (
        odd.startswith("memctl_agent_deploy_bot_")
        and len(odd) == len("memctl_agent_deploy_bot_") + 8
    )
    assert agents.role_name_for("Deploy-Bot") != agents.role_name_for("deploy_bot")
    assert len(agents.role_name_for("x" * 200).encode()) <= 63


def test_every_memory_table_has_row_level_security_and_policies(conn, places_of):
    """From the catalog: every table with an agent or namespace column (vector tables too), not a list."""
    tables = places_of(conn).agent_tables()
    assert {
        "episodes",
        "chunks",
        "facts",
        "fact_history",
        "episode_access",
        "summary_sources",
        "runbook_runs",
        "embed_queue",
        "embed_failures",
    } <= set(tables)
    unprotected = conn.execute(
        """
        SELECT c.relname FROM pg_class c WHERE c.relname = ANY(%s) AND c.relnamespace = current_schema()::regnamespace
          AND (NOT c.relrowsecurity OR NOT EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid))""",
        (tables,),
    ).fetchall()
    assert unprotected == []


def test_a_table_added_later_is_caught_and_a_new_models_table_is_protected(
    conn, memctl_env, places_of
):
    from memctl.embedding import embedders, models

    conn.execute("CREATE TABLE later_memory (agent text, note text)")
    missing = [
        r["relname"]
        for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relname = ANY(%s) AND NOT relrowsecurity",
            (places_of(conn).agent_tables(),),
        )
    ]
    assert missing == ["later_memory"]
    conn.execute("DROP TABLE later_memory")
    model = models.register(
        conn, embedders.HashEmbedder("h", dims=8), state="backfill", build_index=False
    )
    row = conn.execute(
        "SELECT relrowsecurity, (SELECT count(*) FROM pg_policy WHERE polrelid = c.oid) AS n "
        "FROM pg_class c WHERE relname = %s",
        (model.table_name,),
    ).fetchone()
    assert row == {"relrowsecurity": True, "n": 1}


def test_set_role_to_an_agent_sees_only_its_own_episodes_and_facts(
    conn, can_create_roles, memctl_env
):
    agents.add(conn, "alice", shared=["infra"])
    agents.add(conn, "bob")
    mine, theirs = _seed(conn)
    episodes.add(conn.use_settings(config.load()), "the owner's own note", agent="default")
    _as(conn, "alice")
    assert [r["id"] for r in conn.execute("SELECT id FROM episodes ORDER BY id")] == [mine]
    assert {r["agent"] for r in conn.execute("SELECT agent FROM chunks")} == {"alice"}
    assert {
        (r["namespace"], r["value"]) for r in conn.execute("SELECT namespace, value FROM facts")
    } == {("alice", "10.0.0.1"), ("infra", "1.1.1.1")}
    assert {r["namespace"] for r in conn.execute("SELECT namespace FROM fact_history")} == {
        "alice",
        "infra",
    }
    # nothing the policies hide can be written either: bob's episode, a shared namespace, another agent's rows
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with conn.transaction():
            conn.execute(
                WRITER + "INSERT INTO episodes (agent, content, content_hash, importance) "
                "VALUES ('bob', 'x', '', 5)"
            )  # marked: the database's policy refuses it, not the test trigger
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with conn.transaction():
            conn.execute(
                WRITER + "INSERT INTO facts (namespace, key, value, version) "
                "VALUES ('infra', 'dns', '6.6.6.6', 9)"
            )
    assert (
        conn.execute(
            WRITER + "UPDATE episodes SET importance = 0 WHERE id = %s", (theirs,)
        ).rowcount
        == 0
    )
    # the registry (token hashes), the job log, the migrations and the erasure ledger are not its to read
    for table in ("agents", "jobs", "memctl_migrations", "erasures"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with conn.transaction():
                conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
    conn.execute("RESET ROLE")  # the owner is unaffected
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 3


def test_the_text_index_function_gives_an_agent_only_its_own_ids_whatever_it_is_asked(
    conn, can_create_roles, memctl_env
):
    """memctl_agent_matches (sql/0022) runs the text index with the owner's rights: called directly in alice's
    role with any query (one matching every episode, a negation, bob's own words) it gives none of bob's ids,
    nor anything to a role that is not an agent's; it takes no argument naming whose episodes to read."""
    agents.add(conn, "alice")
    agents.add(conn, "bob")
    mine, theirs = _seed(conn)
    bobs_only = episodes.add(
        conn.use_settings(config.load()), "bob alone knows the kestrel", agent="bob"
    )
    matches = "SELECT memctl_agent_matches(%s::tsquery) AS ids"
    queries = [
        "heron",
        "heron & queue",
        "bob",
        "kestrel",
        "alice | bob | heron | kestrel",
        "!heron",
        "!kestrel",
        "saw:*",
        "b:*",
        "!alice & !bob",
    ]
    _as(conn, "alice")
    seen = {q: conn.execute(matches, (q,)).fetchone()["ids"] for q in queries}
    assert seen["heron"] == [mine] and seen["!kestrel"] == [mine]
    assert all(set(ids) <= {mine} for ids in seen.values()), seen
    # whatever the caller passes, or however it names the function's argument, there is no other to pass
    assert (
        conn.execute(
            "SELECT pronargs FROM pg_proc WHERE proname = 'memctl_agent_matches'"
        ).fetchone()["pronargs"]
        == 1
    )
    _as(conn, "bob")
    assert sorted(conn.execute(matches, ("heron | kestrel",)).fetchone()["ids"]) == sorted(
        [theirs, bobs_only]
    )
    conn.execute(
        "RESET ROLE"
    )  # the owner is no agent: the function gives it nothing (it reads episodes itself)
    assert conn.execute(matches, ("heron",)).fetchone()["ids"] == []
    assert not conn.execute(
        "SELECT has_function_privilege('public', 'memctl_agent_matches(tsquery)', 'EXECUTE') AS yes"
    ).fetchone()["yes"]
    assert conn.execute(
        "SELECT has_function_privilege('memctl_agents', 'memctl_agent_matches(tsquery)', "
        "'EXECUTE') AS yes"
    ).fetchone()["yes"]


def test_search_in_an_agents_role_finds_by_the_text_index_function(
    conn, can_create_roles, memctl_env
):
    """conn.as_agent marks the handle, and search's statements then read the ids memctl_agent_matches
    finds: alice's words find her episode, in every mode, and never bob's."""
    from memctl.reading import bm25, search, statement
    from memctl.reading.query import Query

    alice = agents.add(conn, "alice")
    agents.add(conn, "bob")
    mine, theirs = _seed(conn)
    settings = config.load()
    conn.use_settings(settings)
    conn.as_agent(alice.role)
    assert conn.in_agent_role and conn.role == alice.role
    for mode in ("text", "hybrid"):
        found = search.search(conn, Query("heron queue", k=10, mode=mode), track=False)
        assert [h.id for h in found.hits] == [mine], mode

    def composed(in_role: bool) -> str:
        parts = statement.StatementParts(
            plan=bm25.Plan(["'heron'"], [1.0], [], ["'heron'"]),
            in_role=in_role,
            stats=bm25.TermStats(n=2.0, avgdl=5.0, common={}),
        )
        return statement.statement(Query("heron", k=5), parts, settings, 20)[0].decode()

    assert "memctl_agent_matches" in composed(True) and "memctl_agent_matches" not in composed(
        False
    )
    conn.as_owner()
    assert not conn.in_agent_role
    assert {
        h.id for h in search.search(conn, Query("heron queue", k=10, mode="text"), track=False).hits
    } == {mine, theirs}


def test_an_agent_writes_through_the_library_in_its_role(conn, can_create_roles, memctl_env):
    agents.add(conn, "alice")
    settings = config.load()
    conn.use_settings(settings)
    _as(conn, "alice")
    new = episodes.add(
        conn, "alice deployed api v2 to the canary", agent="alice", source="mcp:alice"
    )
    facts.set_fact(conn, "db.port", "5432", namespace="alice")
    facts.set_fact(conn, "db.port", "5433", namespace="alice")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        episodes.add(conn, "alice pretends to be bob", agent="bob")
    conn.execute("RESET ROLE")
    assert (
        conn.execute("SELECT agent FROM episodes WHERE id = %s", (new,)).fetchone()["agent"]
        == "alice"
    )
    assert facts.get_fact(conn, "db.port", namespace="alice").value == "5433"


def test_a_read_only_agent_writes_nothing(conn, can_create_roles, memctl_env):
    agents.add(conn, "watcher", read_only=True)
    _as(conn, "watcher")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        episodes.add(conn.use_settings(config.load()), "a watcher writes", agent="watcher")
    conn.execute("RESET ROLE")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _as(conn, "watcher")
        facts.set_fact(conn, "k", "v", namespace="watcher")
    conn.execute("RESET ROLE")
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 0


def test_the_cli_registers_lists_shows_issues_tokens_and_revokes(conn, cli, can_create_roles):
    added = cli("agent", "add", "alice", "--shared-namespace", "infra", "-f", "json")
    assert added.exit_code == 0, added.stderr
    assert added.json()["role"] == "memctl_agent_alice" and added.json()["shared"] == "infra"
    assert cli("agent", "add", "alice").exit_code == 2
    first = cli("agent", "token", "alice")
    assert (
        first.exit_code == 0
        and first.stdout.startswith(agents.TOKEN_PREFIX)
        and first.stdout.count("\n") == 1
    )
    token = first.stdout.strip()
    assert token not in first.stderr
    assert agents.by_token(conn, token).name == "alice"
    stored = conn.execute("SELECT token_sha256 FROM agents").fetchone()["token_sha256"]
    assert bytes(stored) == agents.hash_token(token) and token.encode() not in bytes(stored)
    second = cli("agent", "token", "alice").stdout.strip()
    assert agents.by_token(conn, token) is None and agents.by_token(conn, second).name == "alice"
    listed = cli("agent", "list", "-f", "json").json()
    assert (
        [a["name"] for a in listed] == ["alice"]
        and listed[0]["token"] is True
        and token not in str(listed)
    )
    assert cli("agent", "show", "nobody").exit_code == 4
    assert cli("agent", "token", "nobody").exit_code == 4
    revoked = cli("agent", "revoke", "alice")
    assert revoked.exit_code == 0 and "memctl_agent_alice" in revoked.stderr
    assert agents.by_token(conn, second) is None
    assert conn.execute(agents.ROLE_EXISTS, ("memctl_agent_alice",)).fetchone()["yes"] is False
    assert cli("agent", "revoke", "alice").exit_code == 4


def test_print_sql_makes_the_roles_a_dba_runs(conn, cli, can_create_roles):
    printed = cli("agent", "add", "carol", "--print-sql")
    assert (
        printed.exit_code == 0
        and "CREATE ROLE" in printed.stdout
        and '"memctl_agent_carol"' in printed.stdout
    )
    assert conn.execute("SELECT count(*) AS n FROM agents").fetchone()["n"] == 0
    conn.execute(printed.stdout)  # what the DBA runs
    assert cli("agent", "add", "carol").exit_code == 0


def test_every_mcp_tool_as_alice_with_memctls_scope_removed_never_returns_bobs_rows(
    conn, db_url, can_create_roles, cli, monkeypatch
):
    """The server's scope is the operator's view (no agent: no WHERE agent, any namespace) and episode_get's
    scoped query is swapped for the unscoped one; only alice's role remains. The database keeps her in: each
    search mode runs as asked (both episodes embedded first, so vector mode has vectors to search) and finds
    alice's episode and not bob's."""
    from memctl import db
    from memctl.mcp import sessions, tools

    alice = agents.add(conn, "alice", shared=["infra"])
    agents.add(conn, "bob")
    mine, theirs = _seed(conn)
    assert cli("embed").exit_code == 0
    monkeypatch.setattr(tools, "EPISODE", tools.EPISODE_ANY_AGENT)
    session = sessions.Session(
        config.load(),
        sessions.Scope.make(),
        lambda: db.connect(db_url, vector=True),
        role=alice.role,
    )
    for mode in ("hybrid", "text", "vector"):
        found = tools.search(session, "heron queue", k=50, mode=mode).data
        assert (found["mode"], found["degraded"]) == (mode, False), found
        assert [(h["agent"], h["text"]) for h in found["results"]] == [
            ("alice", "alice saw the heron queue back up")
        ]
    recalled = tools.recall(session, "heron queue db.host").data["items"]
    assert ("alice", "alice saw the heron queue back up") in [
        (i.get("agent"), i.get("content")) for i in recalled
    ]
    assert all("bob" not in str(item) for item in recalled), recalled
    assert tools.episode_get(session, mine).data["agent"] == "alice"
    with pytest.raises(Exception, match="no episode"):
        tools.episode_get(session, theirs)
    with pytest.raises(Exception, match="not found|no fact|does not exist"):
        tools.fact_get(session, "db.host", namespace="bob")
    assert tools.fact_get(session, "db.host", namespace="alice").text == "10.0.0.1"
    assert tools.fact_list(session, namespace="bob").data["facts"] == []
    with pytest.raises(Exception, match="no history"):
        tools.fact_history(session, "db.host", namespace="bob")
    for write in (
        lambda: tools.remember(session, "written as the default agent"),
        lambda: tools.fact_set(session, "db.host", "6.6.6.6", namespace="bob"),
    ):
        with pytest.raises(Exception, match="row-level security|permission denied"):
            write()
    session.close()
    assert facts.get_fact(conn, "db.host", namespace="bob").value == "10.0.0.2"
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 2


def test_recall_for_an_agent_reads_the_namespaces_its_server_reads(conn, cli, can_create_roles):
    agents.add(conn, "alice", shared=["infra"])
    facts.set_fact(conn, "dns.resolver", "10.1.1.1", namespace="infra")
    facts.set_fact(conn, "dns.resolver", "10.9.9.9", namespace="default")
    facts.set_fact(conn, "nginx.port", "8080", namespace="carol")
    alice = cli("recall", "what is the dns resolver", "--agent", "alice", "-f", "json")
    assert alice.exit_code == 0, alice.stderr
    values_ = {i.get("value") for i in alice.json()["items"] if i["kind"] == "fact"}
    assert "10.1.1.1" in values_ and "10.9.9.9" not in values_
    carol = cli(
        "recall", "what is the dns resolver", "--agent", "carol", "-f", "json"
    ).json()  # unregistered
    assert {i.get("value") for i in carol["items"] if i["kind"] == "fact"} == {"10.9.9.9"}
    # recall --batch: a line naming alice reads her namespaces too; a line naming a namespace reads that one
    lines = (
        '{"observation": "what is the dns resolver", "agent": "alice"}\n'
        '{"observation": "what is the dns resolver", "agent": "alice", "namespace": "default"}\n'
    )
    batch = cli("recall", "--batch", "-", "-f", "jsonl", input=lines)
    assert batch.exit_code == 0, batch.stderr
    first, second = batch.jsonl()
    assert {i.get("value") for i in first["items"] if i["kind"] == "fact"} >= {"10.1.1.1"}
    assert "10.9.9.9" not in {i.get("value") for i in first["items"] if i["kind"] == "fact"}
    assert {i.get("value") for i in second["items"] if i["kind"] == "fact"} == {"10.9.9.9"}
