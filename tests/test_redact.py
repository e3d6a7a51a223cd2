"""Secrets never enter memory: redaction on every write path, block and off modes, redact scan --fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memctl import jobs, redact, runbooks
from memctl.errors import MemctlError

LABELLED = [json.loads(line) for line in (Path(__file__).parent / "data" / "secrets_labelled.jsonl").open()]
SECRETS = [r for r in LABELLED if r["kinds"]]
GITHUB = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"
AWS = "AKIAIOSFODNN7EXAMPLE"
DB_PASSWORD = "s3cr3tPass"
COMMIT = "3f2c1a9e8b7d6c5f4e3a2b1c0d9e8f7a6b5c4d3e"
KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
PRIVATE_KEY = (f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_BODY}\nQyNTUxOQAAACBFeGFtcGxl\n"
               "-----END OPENSSH PRIVATE KEY-----")
EPISODE = (f"deploy of {COMMIT} failed: pushed with {GITHUB}, aws key {AWS}, "
           f"db postgresql://app:{DB_PASSWORD}@db.internal:5432/app")
ALL_VALUES = [GITHUB, AWS, DB_PASSWORD, KEY_BODY, "QyNTUxOQAAACBFeGFtcGxl"]


def all_text(conn) -> str:
    """Every text and jsonb value of every table in the database's public schema, joined."""
    from psycopg import sql

    columns = conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                           "WHERE table_schema = 'public' AND data_type IN ('text', 'jsonb')").fetchall()
    parts = []
    for col in columns:
        query = sql.SQL("SELECT string_agg({}::text, E'\\n') AS t FROM {}").format(
            sql.Identifier(col["column_name"]), sql.Identifier(col["table_name"]))
        parts.append(conn.execute(query).fetchone()["t"] or "")
    return "\n".join(parts)


def mode(tmp_path, value: str) -> None:
    (tmp_path / "config.toml").write_text(f'[redaction]\nmode = "{value}"\n')


@pytest.mark.parametrize("record", SECRETS, ids=lambda r: r["kinds"][0])
def test_labelled_secret_lines_are_found_and_replaced(record):
    found = redact.find(record["text"])
    assert sorted({f.kind for f in found}) == sorted(record["kinds"])
    out = redact.replace(record["text"], found)
    assert all(value not in out for value in record["secrets"]), out
    assert f"[REDACTED:{record['kinds'][0]}]" in out


def test_labelled_everyday_lines_are_untouched():
    clean = [r["text"] for r in LABELLED if not r["kinds"]]
    assert len(clean) >= 25
    touched = {text: redact.redact_text(text) for text in clean if redact.redact_text(text) != text}
    assert touched == {}


def test_redaction_is_idempotent():
    once = redact.redact_text(EPISODE)
    assert redact.redact_text(once) == once and redact.find(once) == []


def test_every_write_path_redacts_before_the_database_and_the_embedder(cli, conn, ollama_env):
    added = cli("episode", "add", EPISODE, "--meta", json.dumps({"url": f"redis://:{DB_PASSWORD}@10.0.0.5:6379"}))
    assert added.exit_code == 0, added.stderr
    assert "redacted 4 secret(s)" in added.stderr
    assert "github-token" in added.stderr and "url-password x2" in added.stderr and "aws-access-key" in added.stderr
    assert not any(value in added.stderr + added.stdout for value in ALL_VALUES)
    piped = cli("episode", "add", "-", input=f"key pasted in the ticket:\n{PRIVATE_KEY}\nplease rotate".encode())
    assert piped.exit_code == 0 and "private-key" in piped.stderr
    fact = cli("fact", "set", "deploy.token", GITHUB)
    assert fact.exit_code == 0 and GITHUB not in fact.stdout
    imported = cli("episode", "import", "-", input=json.dumps({"content": f"token {GITHUB} again"}) + "\n")
    assert imported.exit_code == 0 and "redacted 1 secret(s)" in imported.stderr
    embedded = cli("embed")
    assert embedded.exit_code == 0, embedded.stderr
    assert ollama_env and cli("status", "-f", "json").json()["pending"] == 0
    stored = all_text(conn)
    assert not [value for value in ALL_VALUES if value in stored]
    assert COMMIT in stored  # the commit id is intact
    for marker in ("github-token", "aws-access-key", "url-password", "private-key"):
        assert f"[REDACTED:{marker}]" in stored
    # the chunks are exactly what the worker sent to the embedder
    chunks = "\n".join(r["content"] for r in conn.execute("SELECT content FROM chunks").fetchall())
    assert GITHUB not in chunks and "[REDACTED:github-token]" in chunks and COMMIT in chunks
    assert conn.execute("SELECT value FROM facts").fetchone()["value"] == "[REDACTED:github-token]"


def test_block_mode_refuses_the_write_and_names_the_kind(cli, conn, tmp_path):
    mode(tmp_path, "block")
    result = cli("episode", "add", f"push with {GITHUB}")
    assert result.exit_code == 1 and "github-token" in result.stderr and "block" in result.stderr
    assert GITHUB not in result.stderr
    fact = cli("fact", "set", "k", f"postgresql://u:{DB_PASSWORD}@h/db")
    assert fact.exit_code == 1 and "url-password" in fact.stderr and DB_PASSWORD not in fact.stderr
    data = json.dumps({"content": "fine"}) + "\n" + json.dumps({"content": f"aws {AWS}"}) + "\n"
    imported = cli("episode", "import", "-", input=data)
    assert imported.exit_code == 1 and "aws-access-key" in imported.stderr
    counts = conn.execute("SELECT (SELECT count(*) FROM episodes) AS e, (SELECT count(*) FROM facts) AS f").fetchone()
    assert counts == {"e": 0, "f": 0}
    assert cli("episode", "add", f"clean line about {COMMIT}").exit_code == 0


def test_written_with_mode_off_is_found_by_scan_and_gone_after_fix(cli, conn, tmp_path):
    assert cli("episode", "add", "first").exit_code == 0
    assert cli("embed").exit_code == 0  # a model is active: the fix must re-queue
    mode(tmp_path, "off")
    episode_id = int(cli("episode", "add", EPISODE).stdout)
    cli("fact", "set", "deploy.token", GITHUB)
    cli("fact", "set", "deploy.token", "rotated, see the vault")
    with jobs.record(conn, "test") as job:
        job.detail = {"note": "ok"}
    conn.execute("UPDATE jobs SET error = %s", (f"failed with {GITHUB}",))  # as a job before this change wrote it
    assert GITHUB in all_text(conn)
    mode(tmp_path, "redact")
    report = cli("redact", "scan", "-f", "json")
    assert report.exit_code == 0
    hits = report.json()
    assert {h["table"] for h in hits} == {"episodes", "chunks", "fact_history", "jobs"}
    assert {(h["table"], h["column"]) for h in hits} >= {("episodes", "content"), ("chunks", "content"),
                                                         ("fact_history", "new_value"), ("fact_history", "old_value"),
                                                         ("jobs", "error")}
    assert any(h["table"] == "episodes" and h["id"] == str(episode_id) and "github-token" in h["kinds"] for h in hits)
    assert not any(value in report.stdout + report.stderr for value in ALL_VALUES)
    dry = cli("redact", "scan", "--fix")
    assert dry.exit_code == 0 and "--yes" in dry.stderr and GITHUB in all_text(conn)
    fixed = cli("redact", "scan", "--fix", "--yes")
    assert fixed.exit_code == 0, fixed.stderr
    stored = all_text(conn)
    assert not [value for value in ALL_VALUES if value in stored] and COMMIT in stored
    assert cli("redact", "scan", "-f", "json").json() == []
    row = cli("episode", "show", str(episode_id), "-f", "json").json()
    assert "[REDACTED:github-token]" in row["content"] and all(c["pending"] == 1 for c in row["chunks"])
    history = cli("fact", "history", "deploy.token", "-f", "json").json()
    assert [h["new_value"] for h in history] == [None, "rotated, see the vault"]
    assert cli("embed").exit_code == 0 and cli("status", "-f", "json").json()["pending"] == 0


def test_job_errors_and_run_records_are_redacted(conn):
    with pytest.raises(MemctlError):
        with jobs.record(conn, "test") as job:
            job.detail = {"cmd": f"git push https://x:{GITHUB}@github.com/acme/infra", "token": GITHUB}
            raise MemctlError(f"push with {GITHUB} refused")
    row = conn.execute("SELECT error, detail::text AS detail FROM jobs").fetchone()
    assert GITHUB not in row["error"] + row["detail"] and "[REDACTED:github-token]" in row["error"]
    tail = runbooks._Tail()
    tail.add(f"exported AWS_ACCESS_KEY_ID={AWS}\n{PRIVATE_KEY}\ndone\n".encode())
    text = tail.text()
    assert AWS not in text and KEY_BODY not in text and "[REDACTED:private-key]" in text and "done" in text


def test_bad_mode_is_a_configuration_error(cli, tmp_path):
    mode(tmp_path, "loud")
    result = cli("episode", "add", "x")
    assert result.exit_code == 1 and "[redaction] mode" in result.stderr


def test_fact_set_and_import_say_what_they_redacted_never_the_value(cli):
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    done = cli("fact", "set", "deploy.token", token)
    assert done.exit_code == 0, done.stderr
    assert "redacted 1 secret" in done.stderr or "1 secret" in done.stderr
    assert "github" in done.stderr and token not in done.stderr + done.stdout
    imported = cli("fact", "import", "-", input=json.dumps({"key": "ci.token", "value": f"token {token}"}) + "\n")
    assert imported.exit_code == 0 and "github" in imported.stderr and token not in imported.stderr
    assert token not in cli("fact", "get", "ci.token").stdout
