"""Episodes: writes that never wait, validation, chunking, JSONL import."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from memctl import config, db
from memctl import overlap
from memctl.errors import BadValue
from memctl.write import chunking, gate, store
from memctl.records import episodes


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()[
        "n"
    ]  # test helper: constant names


def test_add_prints_only_the_id_and_stores_metadata(cli, conn):
    result = cli(
        "episode",
        "add",
        "deploy failed: disk full",
        "--kind",
        "conversation",
        "--source",
        "ticket:42",
        "--agent",
        "ops-bot",
        "--meta",
        '{"host": "web1"}',
        "--created-at",
        "2026-08-11T09:30:00Z",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip().isdigit()
    row = cli("episode", "show", result.stdout.strip(), "-f", "json").json()
    assert (
        row["kind"] == "conversation" and row["source"] == "ticket:42" and row["agent"] == "ops-bot"
    )
    assert row["importance"] == 8  # default policy for conversation
    assert row["meta"] == {"host": "web1"}
    assert row["created_at"].startswith("2026-08-11T09:30:00")
    assert row["chunks"][0]["pending"] == 0  # no model registered yet: nothing queued


def test_add_from_stdin_and_invalid_utf8(cli):
    ok = cli("episode", "add", "-", input="from a pipe\n".encode())
    assert ok.exit_code == 0
    bad = cli("episode", "add", "-", input=b"caf\xe9")
    assert (
        bad.exit_code == 2 and "UTF-8" in bad.stderr and bad.stdout == ""
    )  # as in an argument (issue 40)


@pytest.mark.parametrize(
    "args,needle,code",
    [
        (
            ["   "],
            "empty",
            2,
        ),  # bad input is exit 2 wherever it is (issue 40): was 1 here, 2 for a query
        (["a\x00b"], "NUL", 2),
        (["x", "--importance", "11"], "--importance", 2),
        (["x", "--importance", "-1"], "--importance", 2),
        (["x", "--created-at", "last tuesday"], "ISO 8601", 2),
        (["x", "--meta", "[1,2]"], "JSON object", 2),
        (["x", "--meta", "{bad"], "not valid JSON", 2),
    ],
)
def test_bad_input_gets_a_clear_error_and_stores_nothing(cli, conn, args, needle, code):
    """Bad text is bad input (exit 1); a bad value of an option is a usage error (exit 2)."""
    result = cli("episode", "add", *args)
    assert result.exit_code == code, result.stdout
    assert needle in result.stderr
    assert result.stdout == ""
    assert count(conn, "episodes") == 0


def test_importance_policy_drops_zero_kinds_and_sets_defaults(cli, conn, memctl_env, tmp_path):
    (tmp_path / "config.toml").write_text("[importance]\nconversation = 9\nstay = 0\ndefault = 3\n")
    dropped = cli("episode", "add", "agent stayed idle", "--kind", "stay")
    assert dropped.exit_code == 0 and dropped.stdout == "" and "not stored" in dropped.stderr
    kept = cli("episode", "add", "user asked about backups", "--kind", "conversation")
    other = cli("episode", "add", "cpu at 40%", "--kind", "metric")
    rows = {r["kind"]: r["importance"] for r in cli("episode", "list", "-f", "json").json()}
    assert rows == {"conversation": 9, "metric": 3}
    assert kept.exit_code == other.exit_code == 0


def test_chunking_by_code_points_with_overlap():
    text = "é" * 2500  # 2 bytes each in UTF-8: byte-based cutting would split characters
    chunks = chunking.chunk_text(text, 1000, 100)
    assert all(len(c) <= 1000 for c in chunks)
    assert "".join(c[100:] if i else c for i, c in enumerate(chunks)) == text
    words = " ".join(f"w{i}" for i in range(1000))
    pieces = chunking.chunk_text(words, 200, 20)
    assert all(p.endswith(" ") or p is pieces[-1] for p in pieces)  # cut at whitespace
    assert chunking.chunk_size_for("all-minilm", 1000) == 768
    assert chunking.chunk_size_for("nomic-embed-text:latest", 1000) == 1000


def test_ten_megabyte_episode_is_accepted_and_chunked_under_a_raised_limit(cli, conn, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        "[limits]\nepisode_bytes = 16777216\n"
    )  # default 1 MiB refuses it
    big = ("The disk on web1 filled up again. " * 320_000)[: 10 * 1024 * 1024]
    result = cli("episode", "add", "-", input=big.encode())
    assert result.exit_code == 0, result.stderr
    episode_id = int(result.stdout)
    stored = conn.execute(
        "SELECT length(content) AS n FROM episodes WHERE id = %s", (episode_id,)
    ).fetchone()
    assert stored["n"] == len(big)
    chunks = conn.execute(
        "SELECT count(*) AS n, max(length(content)) AS longest FROM chunks WHERE episode_id = %s",
        (episode_id,),
    ).fetchone()
    assert chunks["n"] > 10_000 and chunks["longest"] <= 1000


def test_identical_text_is_embedded_once(cli, conn):
    for i in range(3):  # one per agent: the same agent's repeat would be folded, not chunked again
        cli("episode", "add", "same words every time", "--agent", f"agent{i}")
    cli("episode", "add", "something else entirely")
    run = cli("embed", "-f", "json").json()[0]
    assert run["chunks"] == 4
    assert run["embedded"] == 2 and run["copied"] == 2


def test_text_embedded_in_an_earlier_run_is_copied_not_embedded_again(cli, conn):
    cli("episode", "add", "the same text twice")
    assert cli("embed").exit_code == 0
    cli(
        "episode", "add", "the same text twice", "--agent", "another"
    )  # not a repeat: another agent's
    again = cli("embed", "-f", "json")
    assert again.exit_code == 0, again.stderr
    assert again.json()[0]["copied"] == 1 and again.json()[0]["embedded"] == 0
    table = conn.execute("SELECT table_name FROM embedding_models").fetchone()["table_name"]
    vectors = conn.execute(
        f'SELECT DISTINCT embedding::text AS v FROM "{table}"'
    ).fetchall()  # registry name
    assert len(vectors) == 1


def test_list_filters_and_delete(cli):
    a = cli("episode", "add", "alpha", "--agent", "a1", "--kind", "raw").stdout.strip()
    cli("episode", "add", "beta", "--agent", "a2", "--kind", "raw", "--source", "web")
    cli(
        "episode",
        "add",
        "gamma",
        "--agent",
        "a1",
        "--kind",
        "summary",
        "--created-at",
        "2020-01-01",
    )
    assert [r["content"] for r in cli("episode", "list", "--agent", "a1", "-f", "json").json()] == [
        "alpha",
        "gamma",
    ]
    assert [
        r["content"] for r in cli("episode", "list", "--source", "web", "-f", "json").json()
    ] == ["beta"]
    assert len(cli("episode", "list", "--since", "7d", "-f", "json").json()) == 2
    assert len(cli("episode", "list", "--limit", "1", "-f", "json").json()) == 1
    bad_since = cli("episode", "list", "--since", "last week")
    assert (
        bad_since.exit_code == 2
        and "duration" in bad_since.stderr
        and "ISO 8601" in bad_since.stderr
    )
    deleted = cli("episode", "delete", a, "999999")
    assert deleted.exit_code == 0 and "999999" in deleted.stderr
    assert cli("episode", "show", a).exit_code == 4
    assert cli("episode", "delete", "999999").exit_code == 4


def jsonl(*items) -> str:
    return "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items)


def test_import_loads_all_fields(cli, conn):
    data = jsonl(
        {
            "content": "one",
            "kind": "raw",
            "source": "s1",
            "agent": "a",
            "importance": 7,
            "created_at": "2026-01-02T03:04:05+00:00",
            "meta": {"n": 1},
        },
        {"content": "two"},
        "",
        {"content": "three " * 400},
    )
    result = cli("episode", "import", "-", "-f", "json", input=data)
    assert result.exit_code == 0, result.stderr
    summary = result.json()[0]
    assert summary["imported"] == 3 and summary["skipped"] == 0 and summary["chunks"] >= 4
    row = conn.execute(
        "SELECT kind, source, agent, importance, created_at, meta FROM episodes "
        "WHERE content = 'one'"
    ).fetchone()
    assert (row["kind"], row["source"], row["agent"], row["importance"], row["meta"]) == (
        "raw",
        "s1",
        "a",
        7,
        {"n": 1},
    )
    assert row["created_at"].year == 2026
    # ids and chunk ids are consistent: each episode's chunks point at it
    orphans = conn.execute(
        "SELECT count(*) AS n FROM chunks c LEFT JOIN episodes e "
        "ON e.agent = c.agent AND e.id = c.episode_id WHERE e.id IS NULL"
    ).fetchone()["n"]
    assert orphans == 0


def test_import_fails_whole_on_line_n_and_leaves_nothing(cli, conn):
    data = jsonl({"content": "ok"}, {"content": "fine"}, "{broken json", {"content": "later"})
    result = cli("episode", "import", "-", input=data)
    assert result.exit_code == 2
    assert "line 3" in result.stderr and "nothing was imported" in result.stderr
    assert count(conn, "episodes") == 0 and count(conn, "chunks") == 0


def test_import_reads_the_next_batch_while_one_is_copied(memctl_env, db_url, conn, monkeypatch):
    """A batch is copied on a second thread while the import reads and admits the next (memctl.db.overlap):
    each copy waits, after its COPYs, until the source has been asked for a record meanwhile."""
    monkeypatch.setattr(episodes, "BATCH", 3)
    settings = config.load()
    copying, read_meanwhile = threading.Event(), threading.Event()
    threads, real = [], store.copy_episodes

    def copy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        copying.set()
        try:
            copied = real(*args, **kwargs)
            if len(threads) == 1:
                read_meanwhile.wait(20)  # one import at a time would never get there
            return copied
        finally:
            copying.clear()

    def source():
        for i in range(10):
            if copying.is_set():
                read_meanwhile.set()
            yield gate.validate(settings, f"episode {i} about the payment queue")

    monkeypatch.setattr(store, "copy_episodes", copy)
    with db.connect(db_url) as c:
        result = episodes.import_episodes(
            c.use_settings(settings), source(), result=episodes.ImportResult()
        )
    assert read_meanwhile.is_set()
    assert (result.imported, result.chunks, threads) == (10, 10, ["memctl-overlap"] * 4)
    assert count(conn, "episodes") == count(conn, "chunks") == 10
    ids = [r["id"] for r in conn.execute("SELECT id FROM episodes ORDER BY id").fetchall()]
    texts = [
        r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id").fetchall()
    ]
    assert len(set(ids)) == 10 and texts == [
        f"episode {i} about the payment queue" for i in range(10)
    ]


def test_import_failing_after_batches_were_copied_leaves_nothing(
    cli, conn, db_url, memctl_env, monkeypatch
):
    """A bad line met while an earlier batch is being copied on the second thread, and a copy that the database
    refuses: either way the whole import is gone and the connection is fit for the next one."""
    monkeypatch.setattr(episodes, "BATCH", 2)
    data = jsonl(
        *({"content": f"line {i} fine"} for i in range(1, 6)), "{broken json", {"content": "later"}
    )
    result = cli("episode", "import", "-", input=data)
    assert (
        result.exit_code == 2
        and "line 6" in result.stderr
        and "nothing was imported" in result.stderr
    )
    assert count(conn, "episodes") == 0 and count(conn, "chunks") == 0

    settings, calls, real = config.load(), [], store.copy_episodes

    def refused_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            args[0].execute("SELECT 1/0")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "copy_episodes", refused_second)
    with db.connect(db_url) as c:
        with pytest.raises(psycopg.errors.DivisionByZero):
            episodes.import_episodes(
                c.use_settings(settings),
                (gate.validate(settings, f"text {i}") for i in range(7)),
                result=episodes.ImportResult(),
            )
        assert count(conn, "episodes") == 0 and count(conn, "chunks") == 0
        monkeypatch.setattr(store, "copy_episodes", real)
        again = episodes.import_episodes(
            c.use_settings(settings),
            (gate.validate(settings, f"text {i}") for i in range(7)),
            result=episodes.ImportResult(),
        )
    assert again.imported == count(conn, "episodes") == 7


def test_overlap_cancels_the_statement_beside_a_caller_that_fails(db_url, conn):
    """The caller's error cancels the statement running on the second thread (as psycopg does on Ctrl-C), waits
    for it, and leaves the connection free for the rollback; the thread switch interval is restored."""
    cancelled, before = [], sys.getswitchinterval()

    def sleep(c):
        try:
            c.execute("SELECT pg_sleep(120)")
        except psycopg.errors.QueryCanceled as exc:
            cancelled.append(exc)

    with db.connect(db_url) as c:
        with pytest.raises(RuntimeError, match="line 9"):
            with c.transaction(), overlap.Overlap(c) as beside:
                assert sys.getswitchinterval() == pytest.approx(
                    min(before, overlap.SWITCH)
                )  # kept in µs
                beside.run(sleep, c)
                deadline = time.monotonic() + 30
                while (
                    time.monotonic() < deadline
                    and not conn.execute(
                        "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                        (c.info.backend_pid,),
                    ).fetchone()["n"]
                ):
                    time.sleep(0.02)
                raise RuntimeError("line 9: not an episode")
        assert len(cancelled) == 1 and sys.getswitchinterval() == before
        assert c.execute("SELECT 1 AS one").fetchone()["one"] == 1


def test_overlap_raises_the_calls_error_in_the_caller(db_url):
    order = []
    with db.connect(db_url) as c, pytest.raises(ZeroDivisionError):
        with overlap.Overlap(c) as beside:
            beside.run(lambda: order.append("first"))
            beside.run(
                lambda release: order.append("second") or release() or order.append("after"),
                held=True,
            )
            beside.wait()
            assert order == ["first", "second", "after"]
            beside.run(
                lambda release: 1 / 0, held=True
            )  # fails before it releases: run returns all the same
            order.append("caller goes on")
    assert order[-1] == "caller goes on"


@pytest.mark.parametrize(
    "line,needle",
    [
        ({"kind": "raw"}, "'content' is required"),
        ({"content": ""}, "empty"),
        ({"content": "x\u0000y"}, "NUL"),
        ({"content": "x", "importance": 42}, "0 to 10"),
        ({"content": "x", "created_at": "yesterday"}, "ISO 8601"),
        ({"content": "x", "colour": "red"}, "unknown field"),
        ([1, 2], "JSON object"),
    ],
)
def test_import_names_the_problem(cli, line, needle):
    """A bad field value and a line that is no episode record are both bad input (exit 2), both named."""
    result = cli("episode", "import", "-", input=jsonl({"content": "fine"}, line))
    assert result.exit_code == 2 and "line 2" in result.stderr and needle in result.stderr


def test_import_skip_invalid_reports_line_numbers(cli, conn):
    data = jsonl({"content": "a"}, "nope", {"content": "b"}, {"content": ""}, {"content": "c"})
    result = cli("episode", "import", "-", "--skip-invalid", "-f", "json", input=data)
    assert result.exit_code == 0
    summary = result.json()[0]
    assert summary["imported"] == 3 and summary["skipped_lines"] == [2, 4]
    assert "skipped line 2" in result.stderr
    assert count(conn, "episodes") == 3


def test_import_invalid_utf8_line(cli, conn):
    data = b'{"content": "ok"}\n{"content": "caf\xe9"}\n'
    result = cli("episode", "import", "-", input=data)
    assert result.exit_code == 2 and "line 2" in result.stderr and "UTF-8" in result.stderr
    assert count(conn, "episodes") == 0


def test_import_queues_chunks_for_the_active_model(cli, conn):
    cli("episode", "add", "first")
    cli("embed")
    cli("episode", "import", "-", input=jsonl({"content": "second"}, {"content": "third"}))
    status = cli("status", "-f", "json").json()
    assert status["pending"] == 2 and status["episodes"] == 3
    cli("embed")
    assert cli("status", "-f", "json").json()["pending"] == 0


def test_validate_library_defaults():
    settings = config.load(environ={})
    episode = gate.validate(settings, "text")
    assert (episode.kind, episode.agent, episode.importance) == ("observation", "default", 4)
    with pytest.raises(BadValue, match="importance"):
        gate.validate(settings, "text", importance=True)
    with pytest.raises(BadValue, match="empty"):
        gate.validate(settings, "  ")


def test_every_jsonl_reader_reports_a_bad_line_alike(cli, tmp_path):
    """One reader (memctl.files.jsonl): the same broken line 2 gets the same message from every command."""
    broken = '{"content": "x", "query": "x"'

    def two_lines(first: str):
        path = tmp_path / f"in{len(list(tmp_path.iterdir()))}.jsonl"
        path.write_text(f"{first}\n{broken}\n")
        return str(path)

    outcomes = {
        "episode import": cli("episode", "import", two_lines('{"content": "ok"}')),
        "fact import": cli("fact", "import", two_lines('{"key": "a", "value": "b"}')),
        "search --batch": cli("episode", "search", "--batch", two_lines('{"query": "ok"}')),
        "embed timing --file": cli("embed", "timing", "--file", two_lines('{"content": "ok"}')),
        "import": cli("import", two_lines('{"type": "header", "format": 1}')),
    }
    for name, outcome in outcomes.items():
        assert outcome.exit_code == 2, name
        said = (
            outcome.stdout if name == "search --batch" else outcome.stderr
        )  # a batch answers in the line's place
        assert "line 2: not valid JSON" in said, (name, outcome.stderr)


def test_the_reader_skips_blank_lines_and_counts_them(tmp_path):
    from memctl.files import jsonl as reader

    lines = [b'{"a": 1}\n', b"\n", b"  \n", b'{"a": 2}\n']
    assert list(reader.read(lines, fields={"a"})) == [(1, {"a": 1}), (4, {"a": 2})]
    errors = []
    items = list(
        reader.read(
            [b'{"a": 1}', b"[1]", b'{"b": 2}', b"\xff"], fields={"a"}, on_error=errors.append
        )
    )
    assert items == [(1, {"a": 1})]
    assert [str(e) for e in errors] == [
        "line 2: expected a JSON object",
        "line 3: unknown field(s): b",
        "line 4: not valid UTF-8 (byte 0)",
    ]


def test_import_redacts_content_and_meta(cli, conn):
    token = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"
    data = jsonl(
        {
            "content": f"pushed with {token}",
            "meta": {"cmd": f"git push https://x:{token}@github.com/a/b"},
        },
        {"content": "nothing secret here"},
    )
    result = cli("episode", "import", "-", "-f", "json", input=data)
    assert result.exit_code == 0 and result.json()[0]["imported"] == 2
    assert "redacted 2 secret(s)" in result.stderr and token not in result.stderr
    rows = conn.execute("SELECT content, meta::text AS meta FROM episodes ORDER BY id").fetchall()
    assert (
        rows[0]["content"] == "pushed with [REDACTED:github-token]" and token not in rows[0]["meta"]
    )
    assert rows[1]["content"] == "nothing secret here"
    assert token not in "".join(
        r["content"] for r in conn.execute("SELECT content FROM chunks").fetchall()
    )


def test_an_import_run_twice_changes_nothing(cli, conn):
    """A record already stored (same agent, source, time and content: memctl.write.identity) is skipped and
    counted, not stored again nor folded as a repeat; a record with no time is told by its occurrence."""
    data = jsonl(
        {
            "content": "deploy failed: disk full",
            "source": "ci",
            "created_at": "2026-01-02T03:04:05Z",
        },
        {
            "content": "deploy failed: disk full",
            "source": "ci",
            "created_at": "2026-01-02T03:04:05Z",
        },
        {
            "content": "deploy failed: disk full",
            "source": "ci",
            "created_at": "2026-01-02T03:09:05Z",
        },
        {"content": "no time given"},
        {"content": "no time given"},
    )
    first = cli("episode", "import", "-", "-f", "json", input=data)
    assert first.exit_code == 0, first.stderr
    assert (
        first.json()[0]["imported"],
        first.json()[0]["already_stored"],
        first.json()[0]["folded"],
    ) == (4, 1, 2)
    count = conn.execute("SELECT count(*) AS n, sum(repeats) AS r FROM episodes").fetchone()
    again = cli("episode", "import", "-", "-f", "json", input=data)
    assert again.exit_code == 0, again.stderr
    assert (again.json()[0]["imported"], again.json()[0]["already_stored"]) == (0, 5)
    assert (
        conn.execute("SELECT count(*) AS n, sum(repeats) AS r FROM episodes").fetchone()
        == count
        == {"n": 4, "r": 2}
    )
    grown = cli(
        "episode", "import", "-", "-f", "json", input=data + jsonl({"content": "no time given"})
    )
    assert (grown.json()[0]["imported"], grown.json()[0]["already_stored"]) == (
        1,
        5,
    )  # its third occurrence
