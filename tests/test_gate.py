"""The one gate: no statement writes a memory table outside memctl/write/store.py, and every side door is shut.

The first test reads the library's source: a new INSERT or COPY into a memory table anywhere but
the gate's writers (memctl/write/store.py, which take only records memctl.write.gate admitted)
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
from memctl import places
from memctl.write import admission, gate, store

GITHUB = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"
PACKAGE = Path(memctl.__file__).parent
WRITERS = PACKAGE / "write" / "store.py"
WRITE = re.compile(
    r"\b(?:INSERT\s+INTO|COPY)\s+(?:\w+\.)?(" + "|".join(places.MEMORY_TABLES) + r")\b",
    re.IGNORECASE,
)


def _statements(path: Path) -> list[tuple[int, str]]:
    """Every string constant in a module (SQL lives in constants), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_only_the_gate_writes_memory_tables():
    outside, inside = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _statements(path):
            for match in WRITE.finditer(text):
                where = f"{path.relative_to(PACKAGE.parent)}:{line}: {match.group(0)}"
                (inside if path == WRITERS else outside).append(where)
    assert not outside, (
        "memory tables written around the gate (move the statement into memctl/write/store.py "
        "and pass the record through gate.Gate):\n" + "\n".join(outside)
    )
    written = {WRITE.search(w).group(1).lower() for w in inside}
    assert written == set(places.MEMORY_TABLES), (
        f"the gate's writers (memctl/write/store.py) no longer write {set(places.MEMORY_TABLES) - written}"
    )


# The modules whose statements carry the writer marker (memctl.write.values.WRITER; the test suite's trigger lets
# only marked writes into memory tables: tests/test_writer_check.py): the store, and the UPDATEs that count repeats,
# finish a run, erase a fact's values, clear what an erasure removed from runs and rewrite redacted text
# (docs/testing.md "The writer check").
MARKED = {
    "write/values.py",
    "write/store.py",
    "write/repeats.py",
    "runbooks/runbooks.py",
    "records/facts.py",
    "records/erasures.py",
    "records/redact_scan.py",
    "backup/erasure.py",
}


def test_the_writer_marker_is_used_only_by_the_writers():
    from memctl.write.values import WRITER

    users = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if re.search(r"\bWRITER\b", p.read_text()) or WRITER.strip() in p.read_text()
    }
    assert users == MARKED


def test_the_pattern_catches_a_side_door():
    """The scan above would see the kind of statement the import (then transfer.py) used to hold."""
    door = "COPY episodes (id, agent, kind, content) FROM STDIN (FORMAT BINARY)"
    assert WRITE.search(door) and WRITE.search("insert into fact_history (namespace) values (%s)")
    assert not WRITE.search("INSERT INTO jobs (job) VALUES (%s)")


def test_writers_take_only_admitted_records(conn, settings_obj):
    raw = gate.validate(settings_obj, "not through the gate", source="anywhere")
    with pytest.raises(TypeError, match="admitted"):
        with conn.transaction():
            store.insert_episode(conn, raw)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 0


def test_a_record_built_or_copied_outside_the_gate_is_refused(conn, settings_obj):
    """The record types are public dataclasses: one built by hand, or a copy of an admitted one with a field
    changed, is refused by every writer, inside a gate's writing() or not; the gate's own record is written."""
    import dataclasses

    from memctl import redact

    admit = gate.Gate(conn, settings_obj, redact.Redactor("redact"))
    real = admit.new_episode("admitted text", source="ops")
    forged = admission.Episode(
        f"token {GITHUB}",
        "observation",
        "default",
        "ops",
        5,
        None,
        {},
        [f"token {GITHUB}"],
        b"\0" * 32,
        False,
    )
    fact = admit.fact("default", "db.host", "10.0.0.9", "ops")
    writes = [
        lambda: store.insert_episode(conn, forged),
        lambda: store.insert_episode(conn, dataclasses.replace(real, content=f"token {GITHUB}")),
        lambda: store.insert_chunks(conn, forged, 1),
        lambda: store.copy_episodes(
            conn, [forged], now=datetime.datetime.now(datetime.timezone.utc), queued=[]
        ),
        lambda: store.put_fact(
            conn, admission.FactValue("default", "db.password", "hunter2", "ops"), 1
        ),
        lambda: store.put_fact(conn, dataclasses.replace(fact, value="hunter2"), 1),
        lambda: store.insert_history(
            conn, admission.HistoryEntry("default", "k", 1, "set", None, GITHUB, "ops")
        ),
        lambda: store.insert_run(conn, admission.RunRecord({"agent": "a", "name": GITHUB})),
        lambda: store.insert_lineage(
            conn, [admission.Lineage("a", 1, 2, datetime.datetime.now(), b"")]
        ),
        lambda: store.insert_window_lineage(conn, admission.WindowLineage("a", 1)),
        lambda: store.insert_blocked(conn, admission.BlockedSource(GITHUB, GITHUB, None)),
    ]
    for write in writes:
        with pytest.raises(TypeError, match="admitted"):
            with admit.writing():
                write()
    with pytest.raises(dataclasses.FrozenInstanceError):
        real.content = f"token {GITHUB}"  # type: ignore[misc]
    assert GITHUB not in json.dumps(
        conn.execute(
            "SELECT (SELECT json_agg(e) FROM episodes e) AS e, (SELECT json_agg(f) FROM facts f) AS f, "
            "(SELECT json_agg(b) FROM blocked_sources b) AS b"
        ).fetchone(),
        default=str,
    )
    with admit.writing():
        store.insert_episode(conn, real)
    assert _count(conn, "episodes") == 1


def _changes(value, where: str):
    """(where, a change) for every way to change VALUE in place, and each container inside it."""
    if isinstance(value, (str, bytes, int, float, type(None), datetime.datetime)):
        return
    if isinstance(value, dict) or hasattr(value, "keys"):
        for k in list(value):  # what it holds first: the changes below may take it away
            yield from _changes(value[k], f"{where}[{k!r}]")
        key = next(iter(value), "k")
        yield from (
            (f"{where}[{key!r}] =", lambda: value.__setitem__(key, GITHUB)),
            (f"del {where}[{key!r}]", lambda: value.__delitem__(key)),
            (f"{where}.update", lambda: value.update({"new": GITHUB})),
            (f"{where}.pop", lambda: value.pop(key)),
            (f"{where}.clear", lambda: value.clear()),
            (f"{where}.setdefault", lambda: value.setdefault("new", GITHUB)),
            (f"{where}.popitem", lambda: value.popitem()),
            (f"{where} |=", lambda: value.__ior__({"new": 1})),
        )
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(list(value)):
            yield from _changes(item, f"{where}[{i}]")
        yield from (
            (f"{where}.append", lambda: value.append(GITHUB)),
            (f"{where}[0] =", lambda: value.__setitem__(0, GITHUB)),
            (f"{where}.clear", lambda: value.clear()),
        )
    else:
        raise AssertionError(f"{where}: a {type(value).__name__}, which this test cannot change")


def test_an_admitted_record_cannot_be_changed(conn, settings_obj):
    """Every kind of record a gate admits is frozen whole: no field can be set, and what a field holds (an
    episode's meta and chunks, nested values too; a run's row) refuses every change, so in-process code cannot
    make the store write what the gate never saw."""
    import dataclasses

    from memctl import redact

    admit = gate.Gate(conn, settings_obj, redact.Redactor("redact"))
    meta = {"ticket": 12, "tags": ["disk", "web-3"], "by": {"name": "ops", "seen": [1, 2]}}
    fact = admit.fact("default", "db.host", "10.0.0.9", "ops")
    admitted = {
        "episode": admit.new_episode(
            "the disk on web-3 filled up at noon " * 40, source="ops", meta=meta
        ),
        "fact": fact,
        "history": admit.history(fact, 1, "set", None, "10.0.0.9", "ops"),
        "run": admit.run_record(
            {"agent": "ops", "name": "rotate-logs", "steps": 2, "outcome": "ok"}
        ),
        "lineage": admit.lineage("ops", 1, 2, "2026-08-11T03:10:00Z", "00" * 32),
        "window lineage": admit.window_lineage("ops", 1),
        "blocked source": admit.blocked_source("feed", "noisy"),
    }
    kinds = {
        kind
        for kind in vars(admission).values()
        if isinstance(kind, type) and dataclasses.is_dataclass(kind)
    }
    assert {type(record) for record in admitted.values()} == kinds  # every kind a gate admits
    assert len(admitted["episode"].chunks) > 1
    changed = []
    for kind, record in admitted.items():
        for field in dataclasses.fields(record):
            value = getattr(record, field.name)
            try:
                setattr(record, field.name, value)
                changed.append(f"{kind}.{field.name} =")
            except dataclasses.FrozenInstanceError:
                pass
            for where, change in _changes(value, f"{kind}.{field.name}"):
                try:
                    change()
                    changed.append(where)
                except (TypeError, AttributeError):  # refused, or no such method (a tuple's)
                    pass
                except (KeyError, IndexError):  # an earlier change took away what this one changes
                    pass
    assert changed == [], "changed after admission: " + ", ".join(changed)
    assert (
        json.loads(json.dumps(admitted["episode"].meta)) == meta
    )  # written as it came (lists as tuples)
    assert admitted["run"].row["name"] == "rotate-logs"


def test_the_stored_rows_are_what_the_gate_admitted(conn, settings_obj):
    """In-process code that tries to change an admitted record (a token into an episode's meta, nested meta,
    chunks; a run's row) is refused, and every writer (the one-row INSERT and the batch COPY) stores exactly
    what the gate admitted: meta through Jsonb as the same JSON, the chunks in order, the run's name."""
    import contextlib
    import copy
    import pickle

    from memctl import redact

    admit = gate.Gate(conn, settings_obj, redact.Redactor("redact"))
    meta = {"ticket": 12, "tags": ["disk", "web-3"], "by": {"name": "ops", "seen": [1, 2]}}
    episodes = [
        admit.new_episode(
            f"{i}: the disk on web-3 filled up at noon " * 40, source="ops", meta=meta
        )
        for i in range(2)
    ]
    run = admit.run_record(
        {
            "agent": "ops",
            "name": "rotate-logs",
            "commit": "0a1b2c3",
            "dirty": False,
            "steps": 2,
            "from_step": 1,
        }
    )
    admitted_meta = [
        json.loads(json.dumps(e.meta)) for e in episodes
    ]  # as JSON: lists within are tuples
    assert admitted_meta[0] == meta
    assert (
        copy.deepcopy(episodes[0].meta)
        == pickle.loads(pickle.dumps(episodes[0].meta))
        == episodes[0].meta
    )
    smuggle = [lambda e=e: e.meta.__setitem__("note", GITHUB) for e in episodes]
    smuggle += [lambda e=e: e.meta["by"].__setitem__("name", GITHUB) for e in episodes]
    smuggle += [lambda e=e: e.meta["tags"].append(GITHUB) for e in episodes]
    smuggle += [lambda e=e: e.chunks.append(GITHUB) for e in episodes]
    smuggle += [lambda: run.row.__setitem__("name", GITHUB)]
    for change in smuggle:
        with contextlib.suppress(TypeError, AttributeError):
            change()
    with admit.writing():
        ids = [store.insert_episode(conn, episodes[0])]
        ids += store.copy_episodes(
            conn, episodes[1:], now=datetime.datetime.now(datetime.timezone.utc), queued=[]
        ).ids
        run_id = store.insert_run(conn, run).fetchone()["id"]
    for episode, episode_id, before in zip(episodes, ids, admitted_meta):
        stored = conn.execute(
            "SELECT meta, (SELECT array_agg(content ORDER BY seq) FROM chunks c "
            "WHERE c.episode_id = e.id) AS chunks FROM episodes e WHERE id = %s",
            (episode_id,),
        ).fetchone()
        assert stored["meta"] == before == meta
        assert tuple(stored["chunks"]) == episode.chunks and len(episode.chunks) > 1
    assert (
        conn.execute("SELECT name FROM runbook_runs WHERE id = %s", (run_id,)).fetchone()["name"]
        == "rotate-logs"
    )
    assert GITHUB not in json.dumps(
        conn.execute(
            "SELECT (SELECT json_agg(e) FROM episodes e) AS e, (SELECT json_agg(c) FROM chunks c) AS c, "
            "(SELECT json_agg(r) FROM runbook_runs r) AS r"
        ).fetchone(),
        default=str,
    )


def test_a_sourced_record_is_written_only_inside_its_gates_writing_transaction(conn, settings_obj):
    """A new write path that opens its own transaction skips the end-of-write look at blocked sources: the
    store refuses it, so any test of that path fails."""
    from memctl import redact

    admit = gate.Gate(conn, settings_obj, redact.Redactor("off"))
    episode = admit.new_episode("admitted, written around writing()", source="anywhere")
    fact = admit.fact("default", "db.host", "10.0.0.9", "anywhere")
    for write in (
        lambda: store.insert_episode(conn, episode),
        lambda: store.copy_episodes(
            conn, [episode], now=datetime.datetime.now(datetime.timezone.utc), queued=[]
        ),
        lambda: store.insert_history(
            conn, admit.history(fact, 1, "set", None, fact.value, fact.source)
        ),
        lambda: store.put_fact(conn, fact, 1),
    ):
        with pytest.raises(TypeError, match="writing"):
            with conn.transaction():
                write()
    assert (_count(conn, "episodes"), _count(conn, "fact_history"), _count(conn, "facts")) == (
        0,
        0,
        0,
    )
    other = gate.Gate(
        conn, settings_obj, redact.Redactor("off")
    )  # its writing() would not look at "anywhere"
    for write in (
        lambda: store.insert_episode(conn, episode),
        lambda: store.put_fact(conn, fact, 1),
        lambda: store.copy_episodes(
            conn,
            [other.new_episode("x", source="elsewhere"), episode],
            now=datetime.datetime.now(datetime.timezone.utc),
            queued=[],
        ),
    ):
        with pytest.raises(TypeError, match="'anywhere'"):
            with other.writing():
                write()
    assert (_count(conn, "episodes"), _count(conn, "facts")) == (0, 0)
    with admit.writing():
        store.insert_episode(conn, episode)
    assert _count(conn, "episodes") == 1


def test_a_gates_writing_transaction_covers_its_own_connection_only(conn, db_url, settings_obj):
    """What writing() opens is kept on the connection it writes on: a write of the same record on another
    connection, meanwhile, is refused as outside any gate's writing()."""
    from memctl import db, redact

    admit = gate.Gate(conn, settings_obj, redact.Redactor("off"))
    episode = admit.new_episode(
        "admitted once, written on its gate's connection", source="anywhere"
    )
    with db.connect(db_url) as other:
        with admit.writing():
            with pytest.raises(TypeError, match="writing"):
                with other.transaction():
                    store.insert_episode(other, episode)
            store.insert_episode(conn, episode)
        assert not gate.writing_on(conn, "anywhere") and not gate.writing_on(other, "anywhere")
    assert _count(conn, "episodes") == 1


def test_a_redacted_source_is_the_one_allowed_and_looked_at_again(conn, settings_obj):
    """The source kept is the redacted one: it is what the blocked sources are checked against, and confirm()
    looks at it again (a source blocked in its redacted form refuses the write)."""
    from memctl import redact

    admit = gate.Gate(conn, settings_obj, redact.Redactor("redact"))
    fact = admit.fact("default", "db.host", "10.0.0.9", f"src-{GITHUB}")
    entry = admit.history(fact, 1, "set", None, fact.value, f"src-{GITHUB}")
    assert (
        GITHUB not in fact.source and fact.source == entry.source and fact.source in admit.sources
    )
    with admit.writing():
        store.insert_history(conn, entry)
        store.put_fact(conn, fact, 1)
    assert _count(conn, "facts") == 1


def test_a_source_blocked_as_it_was_stored_redacted_refuses_its_next_write(cli, conn):
    """An operator blocks the source name memory shows (redacted); the next write from the raw name is refused."""
    assert cli("fact", "set", "db.host", "10.0.0.9", "-s", f"src-{GITHUB}").exit_code == 0
    shown = conn.execute("SELECT source FROM facts").fetchone()["source"]
    assert GITHUB not in shown
    assert cli("source", "block", shown, "--reason", "leaked a token").exit_code == 0
    line = json.dumps({"key": "db.host", "value": "10.6.6.6", "source": f"src-{GITHUB}"}) + "\n"
    for args, given in (
        (("fact", "set", "db.host", "10.6.6.6", "-s", f"src-{GITHUB}"), None),
        (("fact", "import", "-"), line),
        (("episode", "add", "from the poisoned feed", "-s", f"src-{GITHUB}"), None),
    ):
        refused = cli(*args, input=given)
        assert refused.exit_code == 1 and "blocked" in refused.stderr, (args, refused.stderr)
    assert conn.execute("SELECT value FROM facts").fetchone()["value"] == "10.0.0.9"
    assert _count(conn, "episodes") == 0


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
    conn.execute(
        "DELETE FROM episodes"
    )  # memory lost, not erased: an erased record would be left out
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
    conn.execute(
        "DELETE FROM episodes"
    )  # memory lost, not erased: an erasure would keep the import out
    result = cli("import", "-", *args, input="".join(json.dumps(r) + "\n" for r in lines))
    assert result.exit_code == 0, result.stderr
    return result


def test_a_secret_in_an_imported_chunk_never_reaches_search(cli, conn):
    _reimport_with_chunk_text(
        cli,
        conn,
        "deploy finished cleanly on web-3",
        f"deploy finished cleanly on web-3 token {GITHUB}",
    )
    stored = conn.execute("SELECT string_agg(content, ' ') AS t FROM chunks").fetchone()["t"]
    assert (
        GITHUB not in stored and "token" not in stored
    )  # chunks are made from the episode's own text
    found = cli("episode", "search", "deploy web-3", "-f", "json").json()
    assert found and all(GITHUB not in json.dumps(hit) for hit in found)


def _export_with_vectors(cli) -> list[dict]:
    result = cli("export", "--vectors")
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_vectors_of_chunks_made_elsewhere_are_not_kept(cli, conn):
    """A file whose chunk text differs from what memctl makes of the content: its vectors are dropped, queued."""
    result = _reimport_with_chunk_text(
        cli, conn, "a short episode about redis", "something else entirely", "-f", "json"
    )
    report = result.json()[0]
    assert report["vectors"] == 0 and report["queued"] == 1 and report["chunks_remade"] == 1


@pytest.mark.parametrize("field", ["--source", "--agent"])
def test_names_are_redacted_like_text(cli, conn, field):
    result = cli("episode", "add", "routine note", field, f"bot-{GITHUB}")
    assert result.exit_code == 0, result.stderr
    row = conn.execute("SELECT agent, source FROM episodes").fetchone()
    assert GITHUB not in json.dumps(row) and "[REDACTED:github-token]" in json.dumps(row)


def test_fact_namespace_key_and_source_are_redacted(cli, conn):
    result = cli(
        "fact", "set", f"deploy.{GITHUB}", "v", "-n", f"ns-{GITHUB}", "-s", f"src-{GITHUB}"
    )
    assert result.exit_code == 0, result.stderr
    rows = conn.execute(
        "SELECT namespace, key, source FROM facts UNION ALL "
        "SELECT namespace, key, source FROM fact_history"
    ).fetchall()
    assert rows and GITHUB not in json.dumps(rows)


def test_a_fact_under_a_secret_key_is_a_secret(cli, conn):
    result = cli("fact", "set", "db.password", "hunter2")
    assert result.exit_code == 0, result.stderr
    values = conn.execute(
        "SELECT value FROM facts UNION ALL SELECT new_value FROM fact_history"
    ).fetchall()
    assert all("hunter2" not in (r["value"] or "") for r in values)
    assert "hunter2" not in result.stdout


def test_block_mode_refuses_a_secret_in_a_name(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "block"\n')
    result = cli("episode", "add", "routine note", "--source", f"bot-{GITHUB}")
    assert result.exit_code == 1 and "refused" in result.stderr and GITHUB not in result.stderr
    assert _count(conn, "episodes") == 0


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda r: r["chunks"][0].pop("seq"), "seq"),
        (lambda r: r["chunks"].append("not an object"), "chunks"),
        (lambda r: r.update(kind={"a": 1}), "kind"),
        (lambda r: r.update(agent=5), "agent"),
    ],
)
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
    fact = {
        "type": "fact",
        "namespace": "default",
        "key": "k",
        "value": "v",
        "history": [
            {"version": 1, "op": "set", "old_value": None, "new_value": "u", "changed_at": now},
            {"version": "2", "op": "set", "old_value": "u", "new_value": "v", "changed_at": now},
        ],
    }
    result = cli("import", "-", input=json.dumps(header) + "\n" + json.dumps(fact) + "\n")
    assert result.exit_code == 2 and "line 2" in result.stderr and "version" in result.stderr
    assert _count(conn, "facts") == 0 and _count(conn, "fact_history") == 0


def test_redact_scan_reads_every_column_the_gate_redacts(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "off"\n')
    assert (
        cli(
            "episode", "add", "note", "--source", f"src-{GITHUB}", "--kind", f"k-{GITHUB}"
        ).exit_code
        == 0
    )
    assert cli("fact", "set", "plain.key", "v", "-s", f"src-{GITHUB}").exit_code == 0
    found = cli("redact", "scan", "-f", "json").json()
    columns = {(h["table"], h["column"]) for h in found}
    assert {
        ("episodes", "source"),
        ("episodes", "kind"),
        ("facts", "source"),
        ("fact_history", "source"),
    } <= columns, columns
    fixed = cli("redact", "scan", "--fix", "--yes")
    assert fixed.exit_code == 0, fixed.stderr
    assert cli("redact", "scan", "-f", "json").json() == []


def test_export_file_is_private_from_the_first_byte_and_whole(cli, tmp_path):
    assert cli("episode", "add", "something to export").exit_code == 0
    out = tmp_path / "memory.jsonl"
    old_umask = __import__("os").umask(
        0o022
    )  # the usual umask: a plain open() would make the file 0644
    try:
        result = cli("export", "--out", str(out))
    finally:
        __import__("os").umask(old_umask)
    assert result.exit_code == 0, result.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    assert [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".")
    ] == []  # no temporary file left
    assert json.loads(out.read_text().splitlines()[0])["type"] == "header"


def test_an_export_that_fails_leaves_the_old_file(cli, tmp_path, monkeypatch):
    from memctl.transfer import export as export_mod

    out = tmp_path / "memory.jsonl"
    out.write_text("the previous export\n")

    def broken(conn, write, **kwargs):
        write('{"type": "header"}\n')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_mod, "export", broken)
    result = cli("export", "--out", str(out))
    assert (
        result.exit_code == 5 and "No space left" in result.stderr
    )  # a full disk: its own exit code
    assert out.read_text() == "the previous export\n"
    assert [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".")
    ] == []  # the partial file is gone


def test_redact_scan_finds_and_fixes_a_value_under_a_secret_key(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "off"\n')
    assert cli("fact", "set", "db.password", "hunter2").exit_code == 0
    found = cli("redact", "scan", "-f", "json").json()
    assert {(h["table"], h["column"]) for h in found} >= {
        ("facts", "value"),
        ("fact_history", "new_value"),
    }
    assert cli("redact", "scan", "--fix", "--yes").exit_code == 0
    stored = json.dumps(
        conn.execute(
            "SELECT value FROM facts UNION ALL SELECT new_value FROM fact_history"
        ).fetchall()
    )
    assert "hunter2" not in stored


# --- a source blocked while a write runs ------------------------------------------------------------------

FEED = "feed-7"


def _episode_add(conn, settings):
    conn.use_settings(settings)
    from memctl.records import episodes

    episodes.add_episode(conn, "cpu 97% on web-3", source=FEED)


def _episode_import(conn, settings):
    conn.use_settings(settings)
    from memctl.records import episodes

    rows = [
        gate.NewEpisode(f"line {i} of the feed", "observation", "default", FEED, 5, None, {}, i + 1)
        for i in range(1200)
    ]
    episodes.import_episodes(conn, rows, result=episodes.ImportResult())


def _fact_set(conn, settings):
    from memctl.records import facts

    facts.set_fact(conn, "db.host", "10.0.0.9", source=FEED, settings=settings)


def _fact_import(conn, settings):
    from memctl.records import facts

    facts.import_facts(
        conn,
        [
            {"namespace": "default", "key": "db.host", "value": "10.0.0.9", "source": FEED},
            {"namespace": "default", "key": "db.port", "value": "5433", "source": "ok"},
        ],
        settings=settings,
    )


def _memctl_import(lines):
    def write(conn, settings):
        from memctl.transfer import import_

        import_.import_stream(conn.use_settings(settings), iter(lines))

    return write


def _stored(conn) -> dict:
    rows = conn.execute(
        "SELECT (SELECT count(*) FROM episodes WHERE source = %(s)s) AS episodes, "
        "(SELECT count(*) FROM fact_history WHERE source = %(s)s) AS history, "
        "(SELECT count(*) FROM facts) AS facts",
        {"s": FEED},
    ).fetchone()
    return dict(rows)


WAITING = """
SELECT count(*) AS n FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""


def _beside_a_held_block(conn, db_url, settings_obj, source: str, write) -> dict:
    """Block `source` in a transaction held open, run `write` on its own connection meanwhile, check the write
    waits on the blocked sources' lock (not finished while the block is uncommitted), then commit the block and
    return what the write did: {"ok": True} or {"error": exc}."""
    import threading

    from memctl import db
    from memctl.write import sources

    outcome: dict = {}

    def run():
        with db.connect(db_url) as own:
            try:
                write(own, settings_obj)
                outcome["ok"] = True
            except Exception as exc:  # noqa: BLE001 - the test reads what the write raised
                outcome["error"] = exc

    with db.connect(db_url) as blocker:
        with blocker.transaction():
            sources.block(blocker, source, "poisoned")  # held: the block is not committed yet
            writer = threading.Thread(target=run)
            writer.start()
            deadline = datetime.datetime.now() + datetime.timedelta(seconds=60)
            while writer.is_alive() and conn.execute(WAITING).fetchone()["n"] == 0:
                assert datetime.datetime.now() < deadline, (
                    "the write neither finished nor waited for the block"
                )
                writer.join(0.05)
            assert writer.is_alive(), (
                f"the write finished while the block was uncommitted: {outcome}"
            )
        writer.join(60)
    assert not writer.is_alive()
    return outcome


@pytest.mark.parametrize(
    "path", ["episode add", "episode import", "fact set", "fact import", "memctl import"]
)
def test_a_source_blocked_while_a_write_runs_refuses_the_whole_write(
    conn, db_url, settings_obj, path
):
    """The write admitted its records before the block was committed (its first look saw no block); at its end
    it waits for the block and refuses itself: nothing from the source is stored after the block, whatever the
    path (issue 19's side door, for a block that comes while an import runs)."""
    conn.use_settings(settings_obj)
    from memctl.errors import Blocked
    from memctl.records import episodes
    from memctl.transfer import export

    write = {
        "episode add": _episode_add,
        "episode import": _episode_import,
        "fact set": _fact_set,
        "fact import": _fact_import,
    }.get(path)
    if write is None:  # an export holding an episode from the source, taken before it was blocked
        episodes.add_episode(conn, "cpu 97% on web-3", source=FEED)
        lines: list[str] = []
        export.export(conn, lines.append)
        conn.execute(
            "DELETE FROM episodes"
        )  # memory lost, not erased: an erasure would keep the import out
        write = _memctl_import(
            [line.encode() for chunk in lines for line in chunk.splitlines(keepends=True)]
        )
    before = _stored(conn)
    outcome = _beside_a_held_block(conn, db_url, settings_obj, FEED, write)
    assert isinstance(outcome.get("error"), Blocked), outcome
    assert FEED in str(outcome["error"]) and "while this write ran" in str(outcome["error"])
    assert _stored(conn) == before


def test_a_write_that_blocks_its_own_source_is_not_refused_by_it(conn, settings_obj):
    """An export's own blocked sources are restored with it; its records from them were accepted when written."""
    conn.use_settings(settings_obj)
    from memctl.records import episodes
    from memctl.write import sources
    from memctl.transfer import export, import_

    episodes.add_episode(conn, "fetched page text", source=FEED)
    sources.block(conn, FEED, "poisoned")
    lines: list[str] = []
    export.export(conn, lines.append)
    conn.execute(
        "DELETE FROM episodes"
    )  # memory lost, not erased: an erasure would keep the import out
    sources.unblock(conn, FEED)
    import_.import_stream(
        conn, iter(line.encode() for chunk in lines for line in chunk.splitlines(keepends=True))
    )
    assert _stored(conn)["episodes"] == 1
    assert FEED in sources.blocked_set(conn)


def test_a_write_of_more_distinct_sources_than_kept_is_refused_by_any_block_made_meanwhile(
    conn, db_url, settings_obj, monkeypatch
):
    """Memory stays flat however many sources a file holds: past SOURCES_KEPT, a block made while the import
    runs refuses it whole (here a source of its own records, past the kept ones); with no block it lands."""
    conn.use_settings(settings_obj)
    from memctl.errors import Blocked
    from memctl.records import episodes
    from memctl.write import sources

    monkeypatch.setattr(gate, "SOURCES_KEPT", 3)
    sources.block(conn, "blocked-long-ago", "old")

    def rows(tag: str):
        return [
            gate.NewEpisode(
                f"{tag} record {i}", "observation", "default", f"{tag}-{i}", 5, None, {}, i + 1
            )
            for i in range(8)
        ]

    result = episodes.import_episodes(conn, rows("calm"), result=episodes.ImportResult())
    assert result.imported == 8  # a block made before the import is no reason to refuse it

    outcome = _beside_a_held_block(  # feed-6: a source past the three kept
        conn,
        db_url,
        settings_obj,
        "feed-6",
        lambda own, settings: episodes.import_episodes(
            own.use_settings(settings), rows("feed"), result=episodes.ImportResult()
        ),
    )
    assert isinstance(outcome.get("error"), Blocked), outcome
    assert "feed-6" in str(outcome["error"]) and "run it again" in str(outcome["error"])
    assert (
        conn.execute("SELECT count(*) AS n FROM episodes WHERE source LIKE 'feed-%'").fetchone()[
            "n"
        ]
        == 0
    )
