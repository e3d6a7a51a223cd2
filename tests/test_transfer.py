"""memctl export / import: the whole memory as one JSONL stream, round trip exact, nothing half-imported."""

from __future__ import annotations

import datetime
import json

from memctl.write.values import WRITER  # rows planted on purpose pass the writer check
from tests.fix_transfer import counts, records

GITHUB = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"


def comparable(export: str) -> dict:
    """What a round trip must keep exactly: episodes (not ids), facts with history, blocked sources."""
    episodes = sorted(
        (
            r["agent"],
            r["kind"],
            r["source"],
            r["created_at"],
            r["content"],
            r["importance"],
            json.dumps(r["meta"], sort_keys=True),
        )
        for r in records(export, "episode")
    )
    facts = sorted(
        json.dumps({k: v for k, v in r.items()}, sort_keys=True) for r in records(export, "fact")
    )
    blocked = sorted((r["source"], r["reason"]) for r in records(export, "blocked_source"))
    return {"episodes": episodes, "facts": facts, "blocked": blocked}


def populate(cli) -> None:
    start = datetime.datetime(2026, 8, 1, tzinfo=datetime.timezone.utc)
    lines = [
        json.dumps(
            {
                "content": f"episode {i}: deploy {i % 7} rotated logs on web{i % 5}",
                "agent": f"agent{i % 3}",
                "kind": ["raw", "conversation", "observation"][i % 3],
                "source": "ticket-bot" if i < 10 else f"src{i % 4}",
                "importance": 1 + i % 10,
                "created_at": (start + datetime.timedelta(minutes=i)).isoformat(),
                "meta": {"n": i},
            }
        )
        + "\n"
        for i in range(300)
    ]
    assert cli("episode", "import", "-", input="".join(lines)).exit_code == 0
    for i in range(20):
        assert (
            cli("fact", "set", f"svc{i}.host", f"10.8.0.{i}", "--source", "inventory").exit_code
            == 0
        )
        assert cli("fact", "set", f"svc{i}.host", f"10.8.1.{i}").exit_code == 0
    cli("fact", "delete", "svc19.host")
    assert cli("source", "block", "ticket-bot", "--reason", "wrote instructions").exit_code == 0


def test_round_trip_with_vectors_needs_no_embedding(
    cli, db_url, other_db, ollama_env, ollama, tmp_path
):
    populate(cli)
    assert cli("embed").exit_code == 0
    plain = cli("export")
    assert plain.exit_code == 0, plain.stderr
    header = json.loads(plain.stdout.splitlines()[0])
    assert (
        header["type"] == "header"
        and header["format"] == 1
        and header["models"][0]["model"] == "all-minilm"
    )
    assert (
        len(records(plain.stdout, "episode")) == 300
        and "chunks" not in records(plain.stdout, "episode")[0]
    )
    history = {r["key"]: len(r["history"]) for r in records(plain.stdout, "fact")}
    assert history == {**{f"svc{i}.host": 2 for i in range(19)}, "svc19.host": 3}
    path = tmp_path / "with-vectors.jsonl"
    assert cli("export", "--vectors", "--out", str(path)).exit_code == 0
    assert all(c["embedding"] for r in records(path.read_text(), "episode") for c in r["chunks"])
    ollama.requests.clear()
    loaded = cli("import", str(path), "-f", "json", env={"MEMCTL_DATABASE_URL": other_db})
    assert loaded.exit_code == 0, loaded.stderr
    summary = loaded.json()[0]
    assert (
        summary["episodes"] == 300
        and summary["queued"] == 0
        and summary["vectors"] == summary["chunks"] > 0
    )
    target = counts(other_db)
    assert (target["episodes"], target["queued"], target["models"], target["blocked"]) == (
        300,
        0,
        1,
        1,
    )
    status = cli("status", "-f", "json", env={"MEMCTL_DATABASE_URL": other_db}).json()
    assert status["pending"] == 0
    assert cli("embed", env={"MEMCTL_DATABASE_URL": other_db}).exit_code == 0
    assert ollama.embed_requests() == []  # nothing was embedded again
    again = cli("export", env={"MEMCTL_DATABASE_URL": other_db})
    assert comparable(again.stdout) == comparable(plain.stdout)
    # search on the target uses the imported vectors
    hits = cli(
        "episode",
        "search",
        "deploy 3 rotated logs",
        "--mode",
        "vector",
        "-f",
        "json",
        env={"MEMCTL_DATABASE_URL": other_db},
    )
    assert hits.exit_code == 0 and hits.json()


def test_import_into_a_populated_database_deduplicates_and_merges(cli, db_url, other_db, tmp_path):
    populate(cli)
    path = tmp_path / "export.jsonl"
    assert cli("export", "--out", str(path)).exit_code == 0
    env = {"MEMCTL_DATABASE_URL": other_db}
    assert (
        cli("fact", "set", "svc0.host", "10.9.9.9", env=env).exit_code == 0
    )  # the target's own, later change
    assert cli("episode", "add", "only in the target", env=env).exit_code == 0
    first = cli("import", str(path), "-f", "json", env=env).json()[0]
    second = cli("import", str(path), "-f", "json", env=env).json()[0]
    assert first["episodes"] == 300 and second["episodes"] == 0 and second["duplicates"] == 300
    assert second["fact_changes"] == 0 and second["blocked_sources"] == 0
    target = counts(other_db)
    assert target["episodes"] == 301 and target["facts"] == 19
    history = cli("fact", "history", "svc0.host", "-f", "json", env=env).json()
    assert [h["version"] for h in history] == [
        1,
        2,
        3,
    ]  # merged after the target's own version, in order
    assert (
        cli("fact", "get", "svc0.host", env=env).stdout.strip() == "10.9.9.9"
    )  # the later change stays
    assert cli("fact", "get", "svc1.host", env=env).stdout.strip() == "10.8.1.1"
    lines = path.read_text().splitlines()
    copy = json.loads(
        lines[-1] if '"episode"' in lines[-1] else next(x for x in lines if '"type":"episode"' in x)
    )
    moved = {
        **copy,
        "created_at": "2026-01-01T00:00:00+00:00",
        "record_key": None,
    }  # a key would name the stored one
    twice = (
        "\n".join(
            [lines[0], json.dumps({**moved, "id": 10**9}), json.dumps({**moved, "id": 10**9 + 1})]
        )
        + "\n"
    )
    inner = cli("import", "-", "-f", "json", input=twice, env=env).json()[0]
    assert (inner["episodes"], inner["duplicates"]) == (1, 1)


def test_a_corrupt_line_fails_the_import_names_it_and_leaves_nothing(cli, other_db, tmp_path):
    populate(cli)
    lines = cli("export").stdout.splitlines()
    lines[6] = lines[6][: len(lines[6]) // 2]  # line 7 cut in half
    result = cli(
        "import", "-", input="\n".join(lines) + "\n", env={"MEMCTL_DATABASE_URL": other_db}
    )
    assert result.exit_code == 2 and "line 7" in result.stderr
    assert counts(other_db) == {
        "episodes": 0,
        "chunks": 0,
        "facts": 0,
        "history": 0,
        "blocked": 0,
        "queued": 0,
        "models": 0,
    }
    lines = cli("export").stdout.splitlines()
    lines[300] = json.dumps({"type": "episodee", "content": "x"})
    unknown = cli(
        "import", "-", input="\n".join(lines) + "\n", env={"MEMCTL_DATABASE_URL": other_db}
    )
    assert (
        unknown.exit_code == 2
        and "line 301" in unknown.stderr
        and "unknown record type" in unknown.stderr
    )
    assert counts(other_db)["episodes"] == 0


def test_a_newer_format_is_refused_and_a_headerless_file_too(cli, other_db):
    env = {"MEMCTL_DATABASE_URL": other_db}
    newer = json.dumps({"type": "header", "format": 99, "memctl": "9.0"}) + "\n"
    result = cli("import", "-", input=newer, env=env)
    assert (
        result.exit_code == 1 and "format 99" in result.stderr and "upgrade memctl" in result.stderr
    )
    bare = cli(
        "import",
        "-",
        input=json.dumps({"type": "fact", "namespace": "d", "key": "k", "history": []}) + "\n",
        env=env,
    )
    assert bare.exit_code == 2 and "line 1" in bare.stderr and "header" in bare.stderr


def test_import_redacts_and_drops_the_vectors_of_a_redacted_text(cli, conn, tmp_path, places_of):
    assert cli("episode", "add", "first").exit_code == 0
    assert cli("embed").exit_code == 0
    export = cli("export", "--vectors").stdout.splitlines()
    header = json.loads(export[0])
    episode = {
        "type": "episode",
        "id": 77,
        "agent": "default",
        "kind": "raw",
        "source": None,
        "importance": 3,
        "created_at": "2026-08-11T09:30:00+00:00",
        "meta": {},
        "content": f"pushed with {GITHUB}",
        "chunks": [
            {
                "seq": 0,
                "content": f"pushed with {GITHUB}",
                "embedding": [0.1] * header["vectors"]["dims"],
            }
        ],
    }
    fact = {
        "type": "fact",
        "namespace": "default",
        "key": "tok",
        "value": GITHUB,
        "source": None,
        "version": 1,
        "updated_at": "2026-08-11T09:30:00+00:00",
        "history": [
            {
                "version": 1,
                "op": "set",
                "old_value": None,
                "new_value": GITHUB,
                "source": None,
                "changed_at": "2026-08-11T09:30:00+00:00",
            }
        ],
    }
    data = "\n".join([export[0], json.dumps(fact), json.dumps(episode)]) + "\n"
    result = cli("import", "-", "-f", "json", input=data)
    assert result.exit_code == 0, result.stderr
    # one count: the fact's current value is its history's, admitted (and counted) once with the episode's
    assert "redacted 2 secret(s)" in result.stderr and GITHUB not in result.stderr + result.stdout
    summary = result.json()[0]
    assert summary["vectors"] == 0 and summary["queued"] == 1
    held = places_of(conn)
    assert held.holding(GITHUB) == [] and held.holding("[REDACTED:github-token]")


def test_lineage_and_runbook_runs_are_remapped_to_the_new_ids(cli, conn, other_db):
    from memctl import db

    env = {"MEMCTL_DATABASE_URL": other_db}
    assert cli("episode", "add", "only in the target, taking id 1 there", env=env).exit_code == 0
    ids = [
        int(cli("episode", "add", text, "--created-at", when).stdout)
        for text, when in (
            ("web1 disk full at 03:10", "2026-08-01T03:10:00Z"),
            ("rotated nginx logs", "2026-08-01T03:20:00Z"),
            ("pruned source", "2026-08-01T03:30:00Z"),
            ("summary: disk full, logs rotated", "2026-08-02T00:00:00Z"),
        )
    ]
    first, second, pruned, summary = ids
    conn.execute(
        WRITER
        + "INSERT INTO summary_sources (agent, summary_id, source_id, source_created_at, source_hash) "
        "SELECT agent, %s, id, created_at, content_hash FROM episodes WHERE id = ANY(%s)",
        (summary, [first, second, pruned]),
    )
    conn.execute(
        WRITER
        + "INSERT INTO runbook_runs (agent, name, commit, steps, outcome, output_tail, episode_id) "
        "VALUES ('default', 'rotate-logs', 'abc123', 2, 'ok', 'done', %s)",
        (second,),
    )
    conn.execute(
        "DELETE FROM episodes WHERE id = %s", (pruned,)
    )  # as prune deletes a summarized source
    export = cli("export").stdout
    assert len(records(export, "summary_source")) == 3 and len(records(export, "runbook_run")) == 1
    result = cli("import", "-", "-f", "json", input=export, env=env)
    assert result.exit_code == 0, result.stderr
    assert (result.json()[0]["summary_sources"], result.json()[0]["runbook_runs"]) == (3, 1)
    with db.connect(other_db) as target:
        new = {
            r["content"]: r["id"]
            for r in target.execute("SELECT id, content FROM episodes").fetchall()
        }
        lineage = target.execute(
            "SELECT summary_id, source_id FROM summary_sources ORDER BY source_id"
        ).fetchall()
        run = target.execute("SELECT name, episode_id FROM runbook_runs").fetchone()
    summary_here = new["summary: disk full, logs rotated"]
    assert sorted(r["source_id"] for r in lineage) == sorted(
        [-pruned, new["web1 disk full at 03:10"], new["rotated nginx logs"]]
    )
    assert {r["summary_id"] for r in lineage} == {summary_here}
    assert run == {"name": "rotate-logs", "episode_id": new["rotated nginx logs"]}
    shown = cli("episode", "show", str(summary_here), "-f", "json", env=env).json()
    assert sorted(s["exists"] for s in shown["sources"]) == [False, True, True]
    again = cli("import", "-", "-f", "json", input=export, env=env).json()[0]
    assert (again["summary_sources"], again["runbook_runs"], again["episodes"]) == (0, 0, 0)
