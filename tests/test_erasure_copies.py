"""An erasure reaches every copy memctl makes (issue 49): summaries, runbook output, old exports, plain digests, and a
receipt checked before anything is deleted. The first tests are the issue's "How it will be checked", in order;
the write path x erasure x copy matrix is tests/test_erasure_matrix.py."""

from __future__ import annotations

import datetime
import hashlib
import json
import uuid
from pathlib import Path

import pytest

from memctl import places
from memctl.records import erasures

NOW = datetime.datetime.now(datetime.timezone.utc)
CONFIG = '[retention]\nraw = "30d"\n\n[summarize]\nmodel = "llama3.2:3b"\n'


def marker(what: str) -> str:
    return f"zq{what}{uuid.uuid4().hex}"


def day(age: int, minute: int = 0) -> str:
    start = datetime.datetime.combine(
        (NOW - datetime.timedelta(days=age)).date(), datetime.time(9), datetime.timezone.utc
    )
    return (start + datetime.timedelta(minutes=minute)).isoformat()


def load(cli, rows: list[dict]) -> None:
    out = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert out.exit_code == 0, out.stderr


def one(conn, query: str, params=None):
    return next(iter(conn.execute(query, params).fetchone().values()))


@pytest.fixture
def summarized(cli, conn, ollama_env, ollama):
    """A window of three raw episodes 40 days old, summarized: (the marked episode's id and text, summary id)."""
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    leak = marker("said")
    text = f"The intern said {leak} on the call. It was repeated twice."
    load(
        cli,
        [
            {"content": c, "kind": "raw", "source": "agent:ops", "created_at": day(40, i)}
            for i, c in enumerate(
                [f"Disk on web-3 reached 91% at noon {i}. Logs were rotated." for i in range(2)]
                + [text]
            )
        ],
    )
    done = cli("summarize", "-f", "json")
    assert done.exit_code == 0 and len(done.json()) == 1, done.stderr
    summary = done.json()[0]["summary_id"]
    assert leak in one(
        conn, "SELECT content FROM episodes WHERE id = %s", (summary,)
    )  # the stand-in quotes it
    assert cli("embed").exit_code == 0
    return one(conn, "SELECT id FROM episodes WHERE content = %s", (text,)), text, leak, summary


def test_a_summarized_episode_deleted_with_a_receipt_is_in_no_table(
    cli, conn, summarized, places_of, tmp_path
):
    episode, text, leak, summary = summarized
    # The lineage keeps a keyed digest of each source, never its plain sha256.
    plain = places_of(conn).plain_digests(
        text
    )  # beside the text itself only, in its own rows (memctl.places: ROW)
    assert plain and "summary_sources.source_hash" not in plain
    assert {p.split(".")[0].split("_")[0] for p in plain} == {"chunks", "episodes", "vectors"}
    key = erasures.load_key(create=False)
    stored = one(conn, "SELECT source_hash FROM summary_sources WHERE source_id = %s", (episode,))
    assert bytes(stored) == places.lineage_digest(key, hashlib.sha256(text.encode()).digest())
    vectors = one(conn, "SELECT count(*) FROM chunks WHERE episode_id = %s", (summary,))
    assert vectors >= 1

    receipt = tmp_path / "r.json"
    out = cli("episode", "delete", str(episode), "--receipt", str(receipt))
    assert out.exit_code == 0, out.stderr
    assert f"also deleted 1 summary built from them (ids {summary})" in out.stderr
    removed = json.loads(receipt.read_text())["removed"]
    assert (
        removed["summaries"] == 1 and removed["episodes"] == 2 and removed["summary_sources"] == 3
    )
    assert (
        removed["chunks"] >= 2
        and sum(v for k, v in removed.items() if k.startswith("vectors_")) >= 2
    )
    assert places_of(conn).holding(leak) == []
    assert places_of(conn).plain_digests(text) == []
    verified = cli("erasure", "verify")
    assert verified.exit_code == 0, verified.stderr
    # The window's other episodes are summarized again by the next run, without it.
    again = cli("summarize", "-f", "json")
    assert again.exit_code == 0 and [w["sources"] for w in again.json()] == [2]
    assert places_of(conn).holding(leak) == []


@pytest.mark.parametrize(
    "entry", ["kept before issue 49 (no lineage digest)", "keyed lineage digest"]
)
def test_verify_names_a_summary_still_built_from_an_erased_episode(cli, conn, summarized, entry):
    """An erasure made before summaries went with their sources left them: verify says so."""
    episode, _, _, summary = summarized
    key = erasures.load_key()
    items, _ = erasures.capture_episodes(conn, [("default", episode)], key)
    if entry.startswith("kept before"):
        del items[0]["lineage"]
    conn.execute(
        "DELETE FROM episodes WHERE id = %s", (episode,)
    )  # the episode gone, its summary kept
    erasures.record(
        conn,
        erasures.new_entry(
            conn, "episode_delete", key=key, target=str(episode), items={"episodes": items}
        ),
    )
    out = cli("erasure", "verify", "-f", "json")
    assert out.exit_code == 1, out.stderr
    assert [(m["table"], m["row"]) for m in out.json()] == [
        ("summary_sources", f"default/{summary} (source {episode})")
    ]


def test_an_export_from_before_the_erasure_imported_again_brings_nothing_back(
    cli, conn, places_of, tmp_path
):
    leak, value = marker("leak"), marker("value")
    gone = cli("episode", "add", f"the page said {leak}", "--source", "web").stdout.strip()
    assert cli("fact", "set", "db.host", value).exit_code == 0
    assert cli("fact", "set", "db.host", "10.8.0.9").exit_code == 0
    export = tmp_path / "before.jsonl"
    assert cli("export", "--out", str(export)).exit_code == 0
    assert cli("episode", "delete", gone).exit_code == 0
    assert cli("fact", "delete", "db.host", "--erase").exit_code == 0
    assert (
        cli("source", "block", "web").exit_code == 0
    )  # its erased record is left out, not refused

    out = cli("import", str(export), "-f", "json")
    assert out.exit_code == 0, out.stderr
    assert (
        out.json()[0]["erased"] == 4 and out.json()[0]["episodes"] == 0
    )  # the episode, three history values
    assert "left out 4 record(s) erased here before" in out.stderr
    assert places_of(conn).holding(leak) == [] and places_of(conn).holding(value) == []
    assert cli("fact", "get", "db.host").exit_code == 4
    assert cli("erasure", "verify").exit_code == 0

    # The same text by `episode import` and by `ingest`: left out, said, exit 0.
    out = cli(
        "episode",
        "import",
        "-",
        "-f",
        "json",
        input=json.dumps({"content": f"the page said {leak}", "source": "web"}) + "\n",
    )
    assert out.exit_code == 0 and out.json()[0]["erased"] == 1 and out.json()[0]["imported"] == 0
    assert "left out 1 record(s)" in out.stderr
    log = tmp_path / "app.log"
    log.write_text(f"the page said {leak}\nan ordinary line\n")
    out = cli("ingest", str(log))
    assert out.exit_code == 0, out.stderr
    assert "stored 1" in out.stderr and "skipped 1 (1 erased before)" in out.stderr
    assert places_of(conn).holding(leak) == []


@pytest.mark.writer_check_off  # a restore into the database its dump came from (tests/conftest.py)
def test_an_erased_runbook_runs_output_stays_gone_through_a_restore(
    cli, conn, memctl_env, places_of, tmp_path
):
    import git

    Path(memctl_env["MEMCTL_CONFIG"]).write_text(f'[backup]\ndir = "{tmp_path / "backups"}"\n')
    leak = marker("out")
    repo = tmp_path / "books"
    git.Repo.init(repo)
    (repo / "say.md").write_text(
        f"# Say\n\nSays it.\n\n## 1. Say\n\n```sh\necho 'shipped build {leak} today'\nexit 3\n```\n"
    )
    made = git.Repo(repo)
    with made.config_writer() as config:
        config.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    made.index.add(["say.md"])
    made.index.commit("add")
    ran = cli("runbook", "run", "say", "--repo", str(repo), "--yes", "-f", "json")
    assert ran.exit_code == 1, ran.stderr  # failed: its record episode quotes the output too
    assert places_of(conn).holding(leak) == [
        "chunks.content",
        "episodes.content",
        "episodes.tsv",
        "runbook_runs.output_tail",
    ]
    backup = cli("backup", "-f", "json").json()["file"]
    episode = one(conn, "SELECT episode_id FROM runbook_runs")
    out = cli("episode", "delete", str(episode), "--receipt", "-")
    assert out.exit_code == 0 and out.json()["removed"]["runbook_runs"] == 1
    assert places_of(conn).holding(leak) == []
    restored = cli("restore", backup, "--yes", "-f", "json")
    assert restored.exit_code == 0, restored.stderr
    assert restored.json()["erasures_reapplied"][0]["runbook_runs"] == 1
    assert restored.json()["erasures_reapplied"][0]["quotes"] == 1
    assert places_of(conn).holding(leak) == []
    assert conn.execute("SELECT output_tail, outcome, episode_id FROM runbook_runs").fetchall() == [
        {"output_tail": places.ERASED, "outcome": "failed", "episode_id": None}
    ]
    assert cli("erasure", "verify").exit_code == 0
    old = cli("erasure", "verify", "--backup", backup, "-f", "json")
    assert old.exit_code == 1 and ("runbook_runs", "output_tail") in {
        (m["table"], m["column"]) for m in old.json()
    }


def _targets(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    return {
        "missing directory": str(tmp_path / "no" / "such" / "r.json"),
        "directory": str(tmp_path / "a-directory"),
        "symlink": str(tmp_path / "link.json"),
    }


@pytest.mark.parametrize("target", ["missing directory", "directory", "symlink"])
def test_a_receipt_that_cannot_be_written_stops_the_erasure_before_it_starts(
    cli, conn, tmp_path, target
):
    where = _targets(tmp_path)[target]
    episode = cli("episode", "add", "an episode to keep", "--source", "s").stdout.strip()
    assert cli("fact", "set", "db.host", "10.8.0.4").exit_code == 0
    for command in (
        ("episode", "delete", episode),
        ("fact", "delete", "db.host", "--erase"),
        ("purge", "--source", "s", "--yes"),
    ):
        out = cli(*command, "--receipt", where)
        assert out.exit_code == 2, (command, out.stderr)
        assert "nothing was erased" in out.stderr, out.stderr
    assert (
        one(conn, "SELECT count(*) FROM episodes") == 1
        and one(conn, "SELECT count(*) FROM facts") == 1
    )
    assert one(conn, "SELECT count(*) FROM erasures") == 0
    assert (tmp_path / "elsewhere.json").read_text() == "{}"


def test_the_receipt_is_written_again_from_the_ledger(cli, conn, tmp_path):
    episode = cli("episode", "add", f"said {marker('x')}").stdout.strip()
    first = cli("episode", "delete", episode, "--receipt", "-")
    assert first.exit_code == 0
    original = first.json()
    ledger = original["ledger"]["id"]
    again = cli("erasure", "receipt", ledger[:10])
    assert again.exit_code == 0, again.stderr
    copy = again.json()
    assert copy["reissued"] is True and copy["removed"] == original["removed"]
    assert copy["target"]["ids"] == [int(episode)] and copy["erased_at"] == original["erased_at"]
    out = tmp_path / "again.json"
    assert cli("erasure", "receipt", ledger, "--out", str(out)).exit_code == 0
    assert (
        json.loads(out.read_text())["ledger"]["id"] == ledger
        and out.stat().st_mode & 0o777 == 0o600
    )
    assert cli("erasure", "receipt", "0123456789abcdef").exit_code == 4
    assert cli("erasure", "receipt", "xyz").exit_code == 2


def test_a_receipt_on_a_full_disk_says_the_erasure_happened(cli, conn, full_disk, tmp_path):
    episode = cli("episode", "add", f"said {marker('x')}").stdout.strip()
    full_disk.fill()
    out = cli("episode", "delete", episode, "--receipt", str(full_disk.path / "r.json"))
    assert out.exit_code == 5, out.stderr
    assert "the erasure happened and is recorded (ledger entry" in out.stderr
    assert "run the command again" not in out.stderr and "memctl erasure receipt" in out.stderr
    assert one(conn, "SELECT count(*) FROM episodes") == 0
    ledger = one(conn, "SELECT id FROM erasures")
    again = tmp_path / "r.json"
    assert cli("erasure", "receipt", ledger, "--out", str(again)).exit_code == 0
    assert json.loads(again.read_text())["target"]["ids"] == [int(episode)]
