"""An erasure stays erased (issue 41): the ledger in the database and in a file, a restore that re-applies
it, the receipt, `memctl erasure verify`, and the byte-level proof with --full on the embedded server."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import uuid
from pathlib import Path

import pytest
from psycopg import sql

from memctl.records import erasures


def configure(memctl_env, tmp_path) -> Path:
    directory = tmp_path / "backups"
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(f'[backup]\ndir = "{directory}"\n')
    return directory


def marker(what: str) -> str:
    return f"zq{what}{uuid.uuid4().hex}"


def holds(conn, text: str) -> list[str]:
    """Every table of memctl's schema whose rows, as text, contain TEXT."""
    found = []
    tables = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
        "AND relkind = 'r'"
    ).fetchall()
    for table in (r["relname"] for r in tables):
        query = sql.SQL("SELECT count(*) AS n FROM {} t WHERE strpos(t::text, %s) > 0").format(
            sql.Identifier(table)
        )
        if conn.execute(query, (text,)).fetchone()["n"]:
            found.append(table)
    return found


def test_the_sql_digest_is_the_hmac(conn):
    key = os.urandom(32)
    ipad, opad = erasures.pads(key)
    for text in ("", "db.host = 10.8.0.4", "ünïcode ✓ " * 50):
        row = conn.execute(
            sql.SQL("SELECT {} AS d").format(sql.SQL(erasures.digest_sql("%(t)s::text"))),
            {"t": text, "ipad": ipad, "opad": opad},
        ).fetchone()
        assert (
            row["d"]
            == hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
            == erasures.digest(key, text)
        )


def test_every_erasure_is_in_the_table_and_the_file_never_the_text(cli, conn, memctl_env, tmp_path):
    leak, value = marker("leak"), marker("value")
    assert cli("episode", "add", f"poisoned page said {leak}", "--source", "leaky").exit_code == 0
    other = cli("episode", "add", f"an episode to delete {leak}x").stdout.strip()
    assert cli("fact", "set", "db.host", value).exit_code == 0
    assert cli("purge", "--source", "leaky", "--yes").exit_code == 0
    assert cli("fact", "delete", "db.host", "--erase").exit_code == 0
    assert cli("episode", "delete", other).exit_code == 0
    rows = conn.execute(
        "SELECT id, op, source, target, key_id, items FROM erasures ORDER BY erased_at"
    ).fetchall()
    assert [r["op"] for r in rows] == ["purge", "fact_erase", "episode_delete"]
    assert rows[0]["source"] == "leaky" and rows[1]["target"] == "default/db.host"
    path = erasures.ledger_path()
    assert (
        path.stat().st_mode & 0o777 == 0o600 and erasures.key_path().stat().st_mode & 0o777 == 0o600
    )
    text = path.read_text()
    tag = erasures.database_tag(conn)
    lines = [json.loads(line) for line in text.splitlines() if json.loads(line)["database"] == tag]
    assert [line["id"] for line in lines] == [r["id"] for r in rows]
    assert leak not in text and value not in text
    assert leak not in json.dumps([r["items"] for r in rows]) and value not in json.dumps(
        [r["items"] for r in rows]
    )
    key = erasures.load_key(create=False)
    assert erasures.digest(key, value) in rows[1]["items"]["facts"][0]["digests"]

    # Losing either copy keeps the other: sync fills each from the other.
    conn.execute("DELETE FROM erasures WHERE op = 'fact_erase'")
    assert len(erasures.sync(conn)) == 3
    assert conn.execute("SELECT count(*) AS n FROM erasures").fetchone()["n"] == 3


@pytest.mark.writer_check_off  # a restore into the database its dump came from (tests/conftest.py)
def test_restore_re_applies_every_erasure_newer_than_the_backup(cli, conn, memctl_env, tmp_path):
    configure(memctl_env, tmp_path)
    leak, value, gone = marker("leak"), marker("value"), marker("gone")
    assert cli("episode", "add", f"poisoned page said {leak}", "--source", "leaky").exit_code == 0
    assert cli("fact", "set", "db.host", value).exit_code == 0
    doomed = cli("episode", "add", f"to be deleted {gone}").stdout.strip()
    assert cli("episode", "add", "an episode that stays").exit_code == 0
    assert cli("embed").exit_code == 0
    backup = cli("backup", "-f", "json")
    assert backup.exit_code == 0, backup.stderr
    path = backup.json()["file"]

    assert cli("purge", "--source", "leaky", "--yes").exit_code == 0
    assert cli("fact", "delete", "db.host", "--erase").exit_code == 0
    assert cli("episode", "delete", doomed).exit_code == 0
    out = cli("restore", path, "--yes", "-f", "json")
    assert out.exit_code == 0, out.stderr
    reapplied = out.json()["erasures_reapplied"]
    assert [r["op"] for r in reapplied] == ["purge", "fact_erase", "episode_delete"]
    assert [r["episodes"] for r in reapplied] == [1, 0, 1] and reapplied[1]["facts"] == 1
    assert "re-applied 3 erasure(s) newer than the backup" in out.stderr
    for text in (leak, value, gone):
        assert holds(conn, text) == [], text
    assert cli("fact", "get", "db.host").exit_code == 4
    assert cli("fact", "history", "db.host", "-f", "json").json()[-1]["op"] == "erase"
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 1
    assert (
        conn.execute("SELECT count(*) AS n FROM erasures").fetchone()["n"] == 3
    )  # the table has them again
    assert cli("erasure", "verify").exit_code == 0
    old = cli("erasure", "verify", "--backup", path, "-f", "json")
    assert old.exit_code == 1
    assert {(m["table"], m["op"]) for m in old.json()} >= {
        ("episodes", "purge"),
        ("facts", "fact_erase"),
        ("episodes", "episode_delete"),
        ("chunks", "purge"),
    }
    verified = cli("backup", "verify", path)
    assert verified.exit_code == 0 and "3 erasure(s) are newer than this backup" in verified.stderr


def test_verify_names_a_row_that_came_back(cli, conn, memctl_env):
    leak = marker("leak")
    added = cli("episode", "add", f"said {leak}", "--source", "leaky")
    assert cli("purge", "--source", "leaky", "--yes").exit_code == 0
    assert cli("erasure", "verify").exit_code == 0
    back = cli("episode", "add", f"said {leak}", "--source", "elsewhere").stdout.strip()
    out = cli("erasure", "verify", "-f", "json")
    assert out.exit_code == 1 and "hold erased text" in out.stderr
    assert {
        "table": "episodes",
        "row": f"default/{back}",
        "column": "content",
    }.items() <= out.json()[0].items()
    assert added.exit_code == 0


def test_the_receipt_lists_tables_backups_and_exports(cli, conn, memctl_env, tmp_path):
    configure(memctl_env, tmp_path)
    leak = marker("leak")
    first = cli("episode", "add", f"poisoned page said {leak}", "--source", "leaky").stdout.strip()
    assert (
        cli("episode", "add", f"poisoned page said {leak}", "--source", "leaky").exit_code == 0
    )  # a repeat
    assert cli("embed").exit_code == 0
    assert cli("episode", "search", "poisoned page").exit_code == 0  # an access record
    path = cli("backup", "-f", "json").json()["file"]
    export = tmp_path / "out.jsonl"
    assert cli("export", "--out", str(export)).exit_code == 0
    out = cli("purge", "--source", "leaky", "--yes", "--receipt", "-")
    assert out.exit_code == 0, out.stderr
    receipt = out.json()
    assert receipt["receipt"] == "memctl-erasure" and receipt["op"] == "purge"
    removed = receipt["removed"]
    assert removed["episodes"] == 2 and removed["repeats"] == 1 and removed["chunks"] >= 1
    assert removed["episode_access"] == 1 and any(
        k.startswith("vectors_") and v >= 1 for k, v in removed.items()
    )
    assert [b["file"] for b in receipt["copies"]["backups"]] == [path]
    assert [e["file"] for e in receipt["copies"]["exports"]] == [str(export.resolve())]
    assert "WAL" in receipt["copies"]["wal"] and receipt["ledger"]["id"]
    assert first

    file_receipt = tmp_path / "fact-receipt.json"
    assert cli("fact", "set", "k", marker("v")).exit_code == 0
    out = cli("fact", "delete", "k", "--erase", "--receipt", str(file_receipt))
    assert out.exit_code == 0 and file_receipt.stat().st_mode & 0o777 == 0o600
    data = json.loads(file_receipt.read_text())
    assert data["removed"]["facts"] == 1 and data["vacuum"]["ran"] == "VACUUM"
    assert cli("fact", "delete", "k2", "--receipt", "-").exit_code == 2  # needs --erase


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if "pg_wal" in path.parts or not path.is_file():
            continue
        try:
            if needle in path.read_bytes():
                found.append(str(path.relative_to(root)))
        except OSError:
            pass
    return found


@pytest.mark.superuser("it reads the data directory and runs CHECKPOINT")
def test_full_leaves_the_marker_in_no_file_of_the_data_directory(cli, conn, memctl_env):
    if os.environ.get("MEMCTL_TEST_DATABASE_URL"):
        pytest.skip(
            "needs the embedded server's data directory: MEMCTL_TEST_DATABASE_URL names another server"
        )
    from memctl.db import embedded

    pgdata = embedded.pgdata_dir()
    if not os.access(pgdata, os.R_OK | os.X_OK):
        pytest.skip(f"the data directory {pgdata} is not readable by this user")
    leak, value = marker("byteleak"), marker("bytevalue")
    for n in range(3):
        assert (
            cli("episode", "add", f"poisoned page {n} said {leak}", "--source", "leaky").exit_code
            == 0
        )
    assert cli("fact", "set", "db.host", value).exit_code == 0
    assert cli("embed").exit_code == 0
    conn.execute("CHECKPOINT")
    assert _files_holding(pgdata, leak.encode())  # the test can see it before
    out = cli("purge", "--source", "leaky", "--yes", "--full", "--receipt", "-")
    assert out.exit_code == 0, out.stderr
    assert (
        out.json()["vacuum"]["ran"] == "VACUUM FULL" and out.json()["vacuum"]["checkpoint"] is True
    )
    assert cli("fact", "delete", "db.host", "--erase", "--full").exit_code == 0
    assert _files_holding(pgdata, leak.encode()) == []
    assert _files_holding(pgdata, value.encode()) == []


@pytest.mark.writer_check_off  # a restore into the database its dump came from (tests/conftest.py)
def test_the_issue_check_through_the_installed_binary(memctl_bin, memctl_env, conn, tmp_path):
    """Issue 41's check, as an operator runs it: the installed memctl in a subprocess."""
    configure(memctl_env, tmp_path)
    leak, value = marker("leaky"), marker("fact")
    env = dict(memctl_env)

    def run(*args: str):
        out = memctl_bin(*args, env=env)
        return out

    assert (
        run("episode", "add", f"the page told agents to {leak}", "--source", "leaky").exit_code == 0
    )
    assert run("fact", "set", "db.host", value).exit_code == 0
    made = run("backup", "-f", "json")
    assert made.exit_code == 0, made.stderr
    path = json.loads(made.stdout)["file"]
    purged = run("purge", "--source", "leaky", "--yes", "--receipt", "-")
    assert purged.exit_code == 0, purged.stderr
    receipt = json.loads(purged.stdout)
    assert receipt["removed"]["episodes"] == 1 and receipt["removed"]["chunks"] >= 1
    assert path in [b["file"] for b in receipt["copies"]["backups"]]
    assert run("fact", "delete", "db.host", "--erase").exit_code == 0
    restored = run("restore", path, "--yes")
    assert restored.exit_code == 0, restored.stderr
    assert "re-applied 2 erasure(s) newer than the backup" in restored.stderr
    assert holds(conn, leak) == [] and holds(conn, value) == []
    verified = run("erasure", "verify")
    assert verified.exit_code == 0, verified.stderr
    old = run("erasure", "verify", "--backup", path, "-f", "json")
    assert old.exit_code == 1 and "hold erased text" in old.stderr
    assert {(m["table"], m["column"]) for m in json.loads(old.stdout)} >= {
        ("episodes", "content"),
        ("facts", "value"),
    }


GITHUB = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"


@pytest.mark.writer_check_off  # a restore into the database its dump came from (tests/conftest.py)
def test_a_redaction_fix_and_a_prune_of_a_blocked_source_are_erasures_too(
    cli, conn, memctl_env, tmp_path
):
    configure(memctl_env, tmp_path)
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        Path(memctl_env["MEMCTL_CONFIG"]).read_text()
        + '[redaction]\nmode = "off"\n[retention]\nraw = "1d"\n'
    )
    assert cli("episode", "add", f"the token is {GITHUB}").exit_code == 0
    old = marker("old")
    assert (
        cli(
            "episode",
            "add",
            f"old poisoned {old}",
            "--source",
            "bad",
            "--kind",
            "raw",
            "--created-at",
            "2020-01-01T00:00:00Z",
        ).exit_code
        == 0
    )
    path = cli("backup", "-f", "json").json()["file"]
    assert cli("redact", "scan", "--fix", "--yes").exit_code == 0
    assert cli("source", "block", "bad").exit_code == 0
    assert cli("prune", "--yes").exit_code == 0
    ops = [r["op"] for r in conn.execute("SELECT op FROM erasures ORDER BY erased_at").fetchall()]
    assert ops == ["redact_fix", "prune_blocked"]
    assert cli("erasure", "verify").exit_code == 0
    out = cli("restore", path, "--yes")
    assert out.exit_code == 0, out.stderr
    assert holds(conn, GITHUB) == [] and holds(conn, old) == []
