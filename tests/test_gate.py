"""The one gate: no statement writes a memory table outside memctl/records/store.py, and every side door is shut.

The first test reads the library's source: a new INSERT or COPY into a memory table anywhere but
the gate's writers (memctl/records/store.py, which take only records memctl.records.gate admitted)
fails it, so a path around the gate cannot be added unnoticed. The others reproduce the side doors
found when memctl was tried as an attacker would (issue 19): each must be refused or redacted, with
nothing half written.
"""

from __future__ import annotations

import ast
import datetime
import json
import re
from pathlib import Path

import pytest

import memctl
from memctl.records import gate, store

GITHUB = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"
PACKAGE = Path(memctl.__file__).parent
WRITERS = PACKAGE / "records" / "store.py"
WRITE = re.compile(r"\b(?:INSERT\s+INTO|COPY)\s+(?:\w+\.)?(" + "|".join(store.MEMORY_TABLES) + r")\b",
                   re.IGNORECASE)


def _statements(path: Path) -> list[tuple[int, str]]:
    """Every string constant in a module (SQL lives in constants), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_only_the_gate_writes_memory_tables():
    outside, inside = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _statements(path):
            for match in WRITE.finditer(text):
                where = f"{path.relative_to(PACKAGE.parent)}:{line}: {match.group(0)}"
                (inside if path == WRITERS else outside).append(where)
    assert not outside, "memory tables written around the gate (move the statement into memctl/records/store.py " \
                        "and pass the record through gate.Gate):\n" + "\n".join(outside)
    written = {WRITE.search(w).group(1).lower() for w in inside}
    assert written == set(store.MEMORY_TABLES), \
        f"the gate's writers (memctl/records/store.py) no longer write {set(store.MEMORY_TABLES) - written}"


def test_the_pattern_catches_a_side_door():
    """The scan above would see the kind of statement the import (then transfer.py) used to hold."""
    door = 'COPY episodes (id, agent, kind, content) FROM STDIN (FORMAT BINARY)'
    assert WRITE.search(door) and WRITE.search("insert into fact_history (namespace) values (%s)")
    assert not WRITE.search("INSERT INTO jobs (job) VALUES (%s)")


def test_writers_take_only_admitted_records(conn, settings_obj):
    raw = gate.validate(settings_obj, "not through the gate", source="anywhere")
    with pytest.raises(TypeError, match="admitted"):
        with conn.transaction():
            store.insert_episode(conn, raw)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 0


@pytest.fixture
def settings_obj(memctl_env):
    from memctl import config

    return config.load()


def _export(cli) -> str:
    result = cli("export")
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]  # noqa: S608 - fixed names


def test_import_of_a_blocked_source_is_refused_and_leaves_nothing(cli, conn):
    assert cli("episode", "add", "clean one", "--source", "fine").exit_code == 0
    assert cli("episode", "add", "poisoned instructions", "--source", "evil-page").exit_code == 0
    export = _export(cli)
    cli("episode", "delete", *[str(r["id"]) for r in conn.execute("SELECT id FROM episodes").fetchall()])
    assert cli("source", "block", "evil-page", "--reason", "prompt injection").exit_code == 0
    before = (_count(conn, "episodes"), _count(conn, "chunks"))
    result = cli("import", "-", input=export)
    assert result.exit_code == 1, result.stdout
    assert "evil-page" in result.stderr and "blocked" in result.stderr and "line" in result.stderr
    assert (_count(conn, "episodes"), _count(conn, "chunks")) == before
    assert "Traceback" not in result.stderr


def _reimport_with_chunk_text(cli, conn, content: str, chunk_text: str, *args: str):
    """Store and embed an episode, export it with vectors, put CHUNK_TEXT in its first chunk, empty the
    episodes, and import the file back: the import's outcome."""
    assert cli("episode", "add", content, "--source", "ops").exit_code == 0
    assert cli("embed").exit_code == 0
    lines = _export_with_vectors(cli)
    for record in lines:
        if record["type"] == "episode":
            record["chunks"][0]["content"] = chunk_text
    cli("episode", "delete", *[str(r["id"]) for r in conn.execute("SELECT id FROM episodes").fetchall()])
    result = cli("import", "-", *args, input="".join(json.dumps(r) + "\n" for r in lines))
    assert result.exit_code == 0, result.stderr
    return result


def test_a_secret_in_an_imported_chunk_never_reaches_search(cli, conn):
    _reimport_with_chunk_text(cli, conn, "deploy finished cleanly on web-3",
                              f"deploy finished cleanly on web-3 token {GITHUB}")
    stored = conn.execute("SELECT string_agg(content, ' ') AS t FROM chunks").fetchone()["t"]
    assert GITHUB not in stored and "token" not in stored  # chunks are made from the episode's own text
    found = cli("episode", "search", "deploy web-3", "-f", "json").json()
    assert found and all(GITHUB not in json.dumps(hit) for hit in found)


def _export_with_vectors(cli) -> list[dict]:
    result = cli("export", "--vectors")
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_vectors_of_chunks_made_elsewhere_are_not_kept(cli, conn):
    """A file whose chunk text differs from what memctl makes of the content: its vectors are dropped, queued."""
    result = _reimport_with_chunk_text(cli, conn, "a short episode about redis", "something else entirely",
                                       "-f", "json")
    report = result.json()[0]
    assert report["vectors"] == 0 and report["queued"] == 1 and report["chunks_remade"] == 1


@pytest.mark.parametrize("field", ["--source", "--agent"])
def test_names_are_redacted_like_text(cli, conn, field):
    result = cli("episode", "add", "routine note", field, f"bot-{GITHUB}")
    assert result.exit_code == 0, result.stderr
    row = conn.execute("SELECT agent, source FROM episodes").fetchone()
    assert GITHUB not in json.dumps(row) and "[REDACTED:github-token]" in json.dumps(row)


def test_fact_namespace_key_and_source_are_redacted(cli, conn):
    result = cli("fact", "set", f"deploy.{GITHUB}", "v", "-n", f"ns-{GITHUB}", "-s", f"src-{GITHUB}")
    assert result.exit_code == 0, result.stderr
    rows = conn.execute("SELECT namespace, key, source FROM facts UNION ALL "
                        "SELECT namespace, key, source FROM fact_history").fetchall()
    assert rows and GITHUB not in json.dumps(rows)


def test_a_fact_under_a_secret_key_is_a_secret(cli, conn):
    result = cli("fact", "set", "db.password", "hunter2")
    assert result.exit_code == 0, result.stderr
    values = conn.execute("SELECT value FROM facts UNION ALL SELECT new_value FROM fact_history").fetchall()
    assert all("hunter2" not in (r["value"] or "") for r in values)
    assert "hunter2" not in result.stdout


def test_block_mode_refuses_a_secret_in_a_name(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "block"\n')
    result = cli("episode", "add", "routine note", "--source", f"bot-{GITHUB}")
    assert result.exit_code == 1 and "refused" in result.stderr and GITHUB not in result.stderr
    assert _count(conn, "episodes") == 0


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r["chunks"][0].pop("seq"), "seq"),
    (lambda r: r["chunks"].append("not an object"), "chunks"),
    (lambda r: r.update(kind={"a": 1}), "kind"),
    (lambda r: r.update(agent=5), "agent"),
])
def test_malformed_episode_records_name_the_line(cli, conn, mutate, needle):
    assert cli("episode", "add", "an episode", "--source", "ops").exit_code == 0
    assert cli("embed").exit_code == 0
    lines = _export_with_vectors(cli)
    episode_line = next(i for i, r in enumerate(lines) if r["type"] == "episode")
    mutate(lines[episode_line])
    before = _count(conn, "episodes")
    result = cli("import", "-", input="".join(json.dumps(r) + "\n" for r in lines))
    assert result.exit_code == 2, result.stderr
    assert f"line {episode_line + 1}" in result.stderr and needle in result.stderr
    assert "Traceback" not in result.stderr and _count(conn, "episodes") == before


def test_fact_history_with_mixed_version_types_names_the_line(cli, conn):
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    header = {"type": "header", "format": 1}
    fact = {"type": "fact", "namespace": "default", "key": "k", "value": "v", "history": [
        {"version": 1, "op": "set", "old_value": None, "new_value": "u", "changed_at": now},
        {"version": "2", "op": "set", "old_value": "u", "new_value": "v", "changed_at": now}]}
    result = cli("import", "-", input=json.dumps(header) + "\n" + json.dumps(fact) + "\n")
    assert result.exit_code == 2 and "line 2" in result.stderr and "version" in result.stderr
    assert _count(conn, "facts") == 0 and _count(conn, "fact_history") == 0


def test_redact_scan_reads_every_column_the_gate_redacts(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "off"\n')
    assert cli("episode", "add", "note", "--source", f"src-{GITHUB}", "--kind", f"k-{GITHUB}").exit_code == 0
    assert cli("fact", "set", "plain.key", "v", "-s", f"src-{GITHUB}").exit_code == 0
    found = cli("redact", "scan", "-f", "json").json()
    columns = {(h["table"], h["column"]) for h in found}
    assert {("episodes", "source"), ("episodes", "kind"), ("facts", "source"),
            ("fact_history", "source")} <= columns, columns
    fixed = cli("redact", "scan", "--fix", "--yes")
    assert fixed.exit_code == 0, fixed.stderr
    assert cli("redact", "scan", "-f", "json").json() == []


def test_export_file_is_private_from_the_first_byte_and_whole(cli, tmp_path):
    assert cli("episode", "add", "something to export").exit_code == 0
    out = tmp_path / "memory.jsonl"
    old_umask = __import__("os").umask(0o022)  # the usual umask: a plain open() would make the file 0644
    try:
        result = cli("export", "--out", str(out))
    finally:
        __import__("os").umask(old_umask)
    assert result.exit_code == 0, result.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert json.loads(out.read_text().splitlines()[0])["type"] == "header"


def test_an_export_that_fails_leaves_the_old_file(cli, tmp_path, monkeypatch):
    from memctl.upkeep import export as export_mod

    out = tmp_path / "memory.jsonl"
    out.write_text("the previous export\n")

    def broken(conn, write, **kwargs):
        write('{"type": "header"}\n')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_mod, "export", broken)
    result = cli("export", "--out", str(out))
    assert result.exit_code == 5 and "No space left" in result.stderr  # a full disk: its own exit code
    assert out.read_text() == "the previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the partial file is gone


def test_redact_scan_finds_and_fixes_a_value_under_a_secret_key(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "off"\n')
    assert cli("fact", "set", "db.password", "hunter2").exit_code == 0
    found = cli("redact", "scan", "-f", "json").json()
    assert {(h["table"], h["column"]) for h in found} >= {("facts", "value"), ("fact_history", "new_value")}
    assert cli("redact", "scan", "--fix", "--yes").exit_code == 0
    stored = json.dumps(conn.execute("SELECT value FROM facts UNION ALL SELECT new_value FROM fact_history")
                        .fetchall())
    assert "hunter2" not in stored
