"""Facts: set/get/history/delete/erase/export/import, exit codes, concurrency."""

from __future__ import annotations

import json
import threading

import pytest

from memctl import db
from memctl.errors import BadValue, NotFound
from memctl.records import facts


def test_set_prints_old_and_new_value_and_version(cli):
    first = cli("fact", "set", "db.port", "5432", "-f", "json")
    assert first.exit_code == 0, first.stderr
    assert first.json() == [
        {
            "namespace": "default",
            "key": "db.port",
            "old_value": None,
            "new_value": "5432",
            "version": 1,
            "current_value": "5432",
        }
    ]
    second = cli("fact", "set", "db.port", "5433", "--source", "ops", "-f", "json")
    assert second.json()[0]["old_value"] == "5432"
    assert second.json()[0]["version"] == 2


def test_get_prints_bare_value_and_json_row(cli):
    cli("fact", "set", "db.host", "10.8.0.4")
    bare = cli("fact", "get", "db.host")
    assert (bare.exit_code, bare.stdout, bare.stderr) == (0, "10.8.0.4\n", "")
    row = cli("fact", "get", "db.host", "--format", "json").json()
    assert row["value"] == "10.8.0.4" and row["version"] == 1 and row["namespace"] == "default"


def test_missing_key_exits_4_with_nothing_on_stdout(cli):
    result = cli("fact", "get", "nope")
    assert result.exit_code == 4
    assert result.stdout == ""
    assert "nope" in result.stderr


def test_old_value_is_gone_after_set_and_only_history_keeps_it(cli, conn):
    cli("fact", "set", "api.key.name", "old-name")
    cli("fact", "set", "api.key.name", "new-name")
    assert (
        conn.execute("SELECT count(*) AS n FROM facts WHERE value = 'old-name'").fetchone()["n"]
        == 0
    )
    history = cli("fact", "history", "api.key.name", "-f", "json").json()
    assert [h["op"] for h in history] == ["set", "set"]
    assert history[1]["old_value"] == "old-name" and history[1]["new_value"] == "new-name"
    assert set(history[0]) == {
        "namespace",
        "key",
        "version",
        "op",
        "old_value",
        "new_value",
        "source",
        "changed_at",
        "valid_from",
    }


def test_delete_keeps_history_and_versions_continue(cli):
    cli("fact", "set", "k", "v1")
    deleted = cli("fact", "delete", "k", "-f", "json")
    assert deleted.exit_code == 0 and deleted.json()[0]["old_value"] == "v1"
    assert cli("fact", "get", "k").exit_code == 4
    again = cli("fact", "set", "k", "v2", "-f", "json").json()[0]
    assert again["version"] == 3 and again["old_value"] is None
    ops = [h["op"] for h in cli("fact", "history", "k", "-f", "json").json()]
    assert ops == ["set", "delete", "set"]
    assert cli("fact", "delete", "missing").exit_code == 4


def test_erase_removes_values_from_history_and_records_the_erasure(cli, conn):
    cli("fact", "set", "ops.note", "hunter2")
    cli("fact", "set", "ops.note", "hunter3")
    erased = cli("fact", "delete", "ops.note", "--erase", "-f", "json")
    assert erased.exit_code == 0, erased.stderr
    assert (
        erased.json()[0]["history_values_erased"] == 2 and erased.json()[0]["fact_removed"] is True
    )
    rows = conn.execute(
        "SELECT op, old_value, new_value FROM fact_history WHERE key = 'ops.note' ORDER BY version"
    ).fetchall()
    assert [r["op"] for r in rows] == ["set", "set", "erase"]
    assert all(r["old_value"] is None and r["new_value"] is None for r in rows)
    hits = conn.execute(
        "SELECT count(*) AS n FROM fact_history WHERE old_value LIKE 'hunter%%' "
        "OR new_value LIKE 'hunter%%'"
    ).fetchone()["n"]
    assert hits == 0


FILENODES = (
    "SELECT pg_relation_filenode('facts') AS facts, pg_relation_filenode('fact_history') AS history"
)
# Where the value's bytes are in each table's main file, after a CHECKPOINT has written the pages out (0: absent).
IN_FILES = """
SELECT t, position(convert_to(%s, 'UTF8') IN pg_read_binary_file(pg_relation_filepath(t))) AS at
FROM unnest(ARRAY['facts', 'fact_history']) AS t ORDER BY t
"""
CAN_READ_FILES = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
CAN_CHECKPOINT = (
    "SELECT rolsuper OR pg_has_role(current_user, 'pg_checkpoint', 'MEMBER') AS ok FROM pg_roles "
    "WHERE rolname = current_user"
)


def test_erase_says_what_plain_vacuum_leaves_behind(cli, conn):
    cli("fact", "set", "ops.note", "hunter2")
    before = conn.execute(FILENODES).fetchone()
    erased = cli("fact", "delete", "ops.note", "--erase", "-f", "json")
    assert erased.exit_code == 0, erased.stderr
    [row] = erased.json()
    assert row["vacuum"] == "VACUUM" and row["checkpoint"] is False
    for place in ("free space", "WAL archives", "backups", "replicas"):
        assert place in row["still_in"] and place in erased.stderr
    assert "gone from" not in erased.stderr and "--full rewrites the tables" in erased.stderr
    assert conn.execute(FILENODES).fetchone() == before  # plain VACUUM rewrites nothing


def test_erase_full_rewrites_both_tables_and_checkpoints(cli, conn):
    cli("fact", "set", "ops.note", "hunter2-in-the-file")
    cli("fact", "set", "ops.note", "hunter3-in-the-file")
    superuser = conn.execute(CAN_READ_FILES).fetchone()["rolsuper"]
    if superuser:
        conn.execute("CHECKPOINT")
        assert all(r["at"] > 0 for r in conn.execute(IN_FILES, ("-in-the-file",)).fetchall())
    before = conn.execute(FILENODES).fetchone()
    erased = cli("fact", "delete", "ops.note", "--erase", "--full", "-f", "json")
    assert erased.exit_code == 0, erased.stderr
    [row] = erased.json()
    assert row["vacuum"] == "VACUUM FULL" and row["history_values_erased"] == 2
    assert row["checkpoint"] is conn.execute(CAN_CHECKPOINT).fetchone()["ok"]
    assert (
        "WAL archives, backups, dumps and replicas" in row["still_in"]
        and "VACUUM FULL run" in erased.stderr
    )
    after = conn.execute(FILENODES).fetchone()
    assert (
        after["facts"] != before["facts"] and after["history"] != before["history"]
    )  # rewritten into new files
    if superuser:
        conn.execute("CHECKPOINT")
        assert [r["at"] for r in conn.execute(IN_FILES, ("-in-the-file",)).fetchall()] == [0, 0]
    assert cli("fact", "get", "ops.note").exit_code == 4


def test_full_needs_erase(cli):
    cli("fact", "set", "k", "v")
    out = cli("fact", "delete", "k", "--full")
    assert out.exit_code == 2 and "--full needs --erase" in out.stderr
    assert cli("fact", "get", "k").stdout == "v\n"


def test_list_with_prefix_and_namespaces(cli):
    cli("fact", "set", "db.port", "1")
    cli("fact", "set", "db.host", "h")
    cli("fact", "set", "web.port", "2")
    cli("fact", "set", "db.port", "9", "--namespace", "staging")
    keys = [r["key"] for r in cli("fact", "list", "--prefix", "db.", "-f", "json").json()]
    assert keys == ["db.host", "db.port"]
    staging = cli("fact", "list", "-n", "staging", "-f", "json").json()
    assert [(r["key"], r["value"]) for r in staging] == [("db.port", "9")]
    every = cli("fact", "list", "--all-namespaces", "-f", "jsonl").jsonl()
    assert len(every) == 4


@pytest.mark.parametrize("fmt", ["table", "json", "jsonl", "csv"])
def test_every_format_renders(cli, fmt):
    cli("fact", "set", "a", "1")
    result = cli("fact", "list", "-f", fmt)
    assert result.exit_code == 0 and "a" in result.stdout
    if fmt == "csv":
        assert result.stdout.splitlines()[0].startswith("namespace,key,value")


def test_bad_keys_and_nul_are_refused(cli):
    assert cli("fact", "set", "", "v").exit_code == 2  # a bad value of the KEY argument
    too_long = cli("fact", "set", "k" * 256, "v")
    assert too_long.exit_code == 2 and "255" in too_long.stderr
    nul = cli("fact", "set", "k", "a\x00b")
    assert nul.exit_code == 2 and "NUL" in nul.stderr
    assert cli("fact", "set", "k" * 255, "ok").exit_code == 0


def test_value_from_stdin_rejects_invalid_utf8(cli):
    assert cli("fact", "set", "k", "-", input=b"from stdin").exit_code == 0
    assert cli("fact", "get", "k").stdout == "from stdin\n"
    bad = cli("fact", "set", "k", "-", input=b"\xff\xfe")
    assert bad.exit_code == 2 and "UTF-8" in bad.stderr
    assert cli("fact", "get", "k").stdout == "from stdin\n"


def test_concurrent_sets_of_one_key_each_get_their_own_version(db_url):
    errors = []

    def worker(i: int) -> None:
        try:
            with db.connect(db_url) as c:
                facts.set_fact(c, "counter", f"value-{i}", source=f"w{i}")
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with db.connect(db_url) as c:
        history = facts.history(c, "counter")
        assert [h["version"] for h in history] == list(range(1, 21))
        # each change saw the value the previous one wrote: no lost update
        for before, after in zip(history, history[1:]):
            assert after["old_value"] == before["new_value"]
        assert facts.get_fact(c, "counter").version == 20


def test_export_into_a_fresh_database_and_import_back(cli, db_url, empty_db_url, tmp_path):
    cli("fact", "set", "db.port", "5432", "--source", "ops")
    cli("fact", "set", "line", 'tab\there "quoted" ünïcode')
    cli("fact", "set", "x", "1", "-n", "other")
    exported = cli("fact", "export")
    assert exported.exit_code == 0
    dump = tmp_path / "facts.jsonl"
    dump.write_text(exported.stdout)
    with db.connect(empty_db_url) as c:
        from memctl.db import migrate

        migrate.apply(c)
    imported = cli("fact", "import", str(dump), env={"MEMCTL_DATABASE_URL": empty_db_url})
    assert imported.exit_code == 0, imported.stderr
    again = cli("fact", "export", env={"MEMCTL_DATABASE_URL": empty_db_url})
    assert sorted(again.jsonl(), key=json.dumps) == sorted(exported.jsonl(), key=json.dumps)


def test_import_with_a_bad_line_fails_whole_and_names_the_line(cli, conn):
    lines = [
        json.dumps({"key": "a", "value": "1"}),
        json.dumps({"key": "b", "value": "x\u0000y"}),
        json.dumps({"key": "c", "value": "3"}),
    ]
    result = cli("fact", "import", "-", input="\n".join(lines) + "\n")
    assert result.exit_code == 2
    assert "line 2" in result.stderr and "NUL" in result.stderr
    assert conn.execute("SELECT count(*) AS n FROM facts").fetchone()["n"] == 0
    malformed = cli("fact", "import", "-", input='{"key": "a", "value": "1"}\n{not json\n')
    assert malformed.exit_code == 2 and "line 2" in malformed.stderr


def test_library_errors_are_typed(conn):
    with pytest.raises(NotFound):
        facts.get_fact(conn, "missing")
    with pytest.raises(BadValue, match="key"):
        facts.set_fact(conn, "", "v")
    with pytest.raises(BadValue, match="NUL"):
        facts.set_fact(conn, "k", "a\x00b")


def test_password_never_printed(cli):
    url = "postgresql://memctl:s3cretpw@127.0.0.1:1/memctl?connect_timeout=1"
    result = cli("fact", "get", "x", env={"MEMCTL_DATABASE_URL": url})
    assert result.exit_code == 3
    assert "s3cretpw" not in result.stdout + result.stderr
    shown = cli("config", "show", env={"MEMCTL_DATABASE_URL": url})
    assert "s3cretpw" not in shown.stdout and "****" in shown.stdout


def test_schema_behind_is_refused_on_a_server_database(cli, empty_db_url):
    result = cli("fact", "get", "x", env={"MEMCTL_DATABASE_URL": empty_db_url})
    assert result.exit_code == 1
    assert "schema is behind: run memctl db migrate" in result.stderr
    listed = cli(
        "db", "migrate", "--list", "-f", "json", env={"MEMCTL_DATABASE_URL": empty_db_url}
    ).json()
    assert {r["status"] for r in listed} == {"pending"}
    applied = cli("db", "migrate", env={"MEMCTL_DATABASE_URL": empty_db_url})
    assert applied.exit_code == 0
    assert cli("fact", "get", "x", env={"MEMCTL_DATABASE_URL": empty_db_url}).exit_code == 4


def test_erase_in_a_transaction_says_it_did_not_vacuum(db_url):
    with db.connect(db_url, autocommit=False) as conn:
        facts.set_fact(conn, "k", "old-value")
        result = facts.erase_fact(conn, "k")
        conn.commit()
    assert (result.vacuum, result.checkpoint, result.history_values_erased) == (None, False, 1)
    assert "not vacuumed" in result.still_in and "backups" in result.still_in


def test_set_and_import_redact_the_value_and_its_history(cli, conn, tmp_path):
    token = "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
    assert cli("fact", "set", "alerts.slack", token).exit_code == 0
    data = (
        json.dumps({"key": "db.url", "value": "postgresql://app:s3cr3tPass@db.internal/app"}) + "\n"
    )
    assert cli("fact", "import", "-", input=data).exit_code == 0
    assert cli("fact", "get", "alerts.slack").stdout.strip() == "[REDACTED:slack-token]"
    assert (
        cli("fact", "get", "db.url").stdout.strip()
        == "postgresql://app:[REDACTED:url-password]@db.internal/app"
    )
    stored = conn.execute(
        "SELECT string_agg(coalesce(new_value, ''), ' ') AS v FROM fact_history"
    ).fetchone()["v"]
    assert token not in stored and "s3cr3tPass" not in stored
    (tmp_path / "config.toml").write_text('[redaction]\nmode = "block"\n')
    refused = cli("fact", "set", "alerts.slack", token)
    assert (
        refused.exit_code == 1 and "slack-token" in refused.stderr and token not in refused.stderr
    )
    assert cli("fact", "get", "alerts.slack").stdout.strip() == "[REDACTED:slack-token]"
