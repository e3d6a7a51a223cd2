"""`memctl mcp`'s wire and connections: what makes a tool call cheap must not make it wrong.

The stdio transport reads and writes pipes on the event loop (memctl.mcp.transport), anything
else through the SDK's threads; a read takes its idle connection without a round trip when the
socket is quiet, and runs again if the server had ended it after all; the output schemas are
published written out. Each is checked here against the real database and the installed binary.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import jsonschema
import pytest
from pydantic import TypeAdapter

from memctl import config, db
from memctl.mcp import protocol, sessions, tools, transport
from memctl.records import episodes
from tests.installed import memctl_exe

INITIALIZE = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def _terminate_others(conn) -> None:
    """End every other session on this database, and wait until they are gone."""
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    for _ in range(200):
        left = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchone()["n"]
        if not left:
            return
        time.sleep(0.05)
    raise AssertionError("the other sessions did not end")


@pytest.fixture
def session(db_url, memctl_env):
    made = sessions.Session(
        config.load(), sessions.Scope.make(agent="a"), lambda: db.connect(db_url, vector=True)
    )
    yield made
    made.close()


def _backend_of(session) -> int:
    with session.connection() as conn:
        return conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]


# ------------------------------------------------------------ connections


def test_an_idle_connection_is_quiet_until_the_server_ends_it(session, conn):
    first = _backend_of(session)
    with session.connection(rerun=True) as held:
        assert sessions._quiet(held)
    _terminate_others(conn)
    assert not sessions._quiet(
        held
    )  # idle in the session now; its last words (or its end) wait on the socket
    assert _backend_of(session) != first  # proven by a round trip, found dead, opened anew


def test_a_read_on_a_connection_ended_unseen_runs_again(session, conn, monkeypatch):
    """The moment between the server ending a connection and its socket saying so: a read fails with Stale,
    and protocol.answer runs it once more on a new connection; the agent sees only the answer."""
    episodes.add(conn.use_settings(config.load()), "the heron queue drained at noon", agent="a")
    first = _backend_of(session)
    _terminate_others(conn)
    monkeypatch.setattr(
        sessions, "_quiet", lambda held: True
    )  # as if asked just before the socket spoke
    with pytest.raises(sessions.Stale):
        with session.connection(rerun=True) as held:
            held.execute("SELECT 1")
    _terminate_others(conn)
    reply = protocol.answer("search", session, {"query": "heron queue"})
    assert not reply.is_error, reply.content[0].text
    assert [hit["text"] for hit in reply.structured_content["results"]] == [
        "the heron queue drained at noon"
    ]
    assert _backend_of(session) != first


def test_a_write_proves_its_connection_before_it_runs(session, conn, monkeypatch):
    """A write is never run twice: it takes no idle connection unproven, so an ended one is found before."""
    _backend_of(session)
    _terminate_others(conn)
    monkeypatch.setattr(sessions, "_quiet", lambda held: True)
    reply = protocol.answer("remember", session, {"content": "the heron queue is written once"})
    assert not reply.is_error, reply.content[0].text
    rows = conn.execute(
        "SELECT count(*) AS n FROM episodes WHERE content = 'the heron queue is written once'"
    )
    assert rows.fetchone()["n"] == 1


# ------------------------------------------------------------ output schemas


def test_output_schemas_are_written_out_and_pass_the_same_values():
    server = protocol.build(
        sessions.Session(config.load(), sessions.Scope.make(agent="a"), lambda: None), inline=True
    )
    published = {
        tool.name: tool.output_schema
        for tool in asyncio.run(server.list_tools())
        if tool.output_schema
    }
    assert set(published) == {"remember", "search", "recall"}
    for schema in published.values():
        text = json.dumps(schema)
        assert "$ref" not in text and "$defs" not in text and '"anyOf"' not in text
    derived = TypeAdapter(protocol.SearchResult).json_schema()
    hit = {
        "id": 1,
        "text": "t",
        "score": 0.5,
        "created_at": "2026-01-01T00:00:00+00:00",
        "kind": "observation",
        "source": None,
        "agent": "a",
        "importance": 5,
    }
    good = {
        "results": [hit, {**hit, "id": 2, "source": "cron"}],
        "mode": "hybrid",
        "degraded": False,
        "warning": None,
    }
    bad = [
        {**good, "warning": 3},
        {**good, "results": [{**hit, "source": 7}]},
        {**good, "results": [{"id": 1}]},
        {**good, "results": [{**hit, "importance": "high"}]},
        {k: v for k, v in good.items() if k != "mode"},
    ]
    for instance, valid in [(good, True)] + [(b, False) for b in bad]:
        for schema in (derived, published["search"]):
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
            assert (not errors) == valid, (instance, errors)


def test_a_schema_that_refers_to_itself_is_refused():
    node = {
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    with pytest.raises(ValueError, match="refers to itself"):
        protocol.published(node)


# ------------------------------------------------------------ the wire


def _lines_of(data: bytes, limit: int) -> list:
    async def read():
        reader = asyncio.StreamReader(limit=limit)
        reader.feed_data(data)
        reader.feed_eof()
        return [line async for line in transport.lines(reader)]

    return asyncio.run(read())


def test_lines_skip_an_overlong_one_and_read_on():
    got = _lines_of(b"short\n" + b"x" * 1000 + b"\nafter\n" + b"y" * 300 + b"\nlast", limit=64)
    assert got[0] == b"short\n" and got[2] == b"after\n" and got[4] == b"last"
    assert isinstance(got[1], ValueError) and isinstance(got[3], ValueError) and len(got) == 5
    assert _lines_of(b"", limit=64) == []
    assert (
        _lines_of(b"z" * 5000, limit=64)[0].__class__ is ValueError
    )  # no newline ever: skipped, ended


def test_a_line_of_many_megabytes_is_skipped_whole():
    """A hostile client's one long line: skipped a buffer at a time (the reader never holds more than its
    limit), then the next line is read as usual."""
    got = _lines_of(b"q" * (32 << 20) + b"\nok\n", limit=1 << 16)
    assert isinstance(got[0], ValueError) and got[1:] == [b"ok\n"]


def _serve_files(tmp_path, messages, env) -> tuple[list[dict], str]:
    """`memctl mcp < requests > answers`: regular files, which the SDK's threaded transport reads."""
    requests, answers = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    requests.write_text("".join(json.dumps(m) + "\n" for m in messages))
    with open(requests, "rb") as stdin, open(answers, "wb") as stdout:
        proc = subprocess.run(
            [memctl_exe(), "mcp", "--agent", "a"],
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in answers.read_text().splitlines()], proc.stderr


def test_files_as_stdin_and_stdout_are_served_too(conn, memctl_env, tmp_path):
    calls = [
        {
            "jsonrpc": "2.0",
            "id": 10 + i,
            "method": "tools/call",
            "params": {"name": "remember", "arguments": {"content": f"file note {i}"}},
        }
        for i in range(3)
    ]
    calls.append(
        {
            "jsonrpc": "2.0",
            "id": 20,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "file note", "mode": "text"}},
        }
    )
    answers, err = _serve_files(tmp_path, INITIALIZE + calls, memctl_env)
    by_id = {a["id"]: a for a in answers}
    assert set(by_id) == {1, 10, 11, 12, 20}
    assert all(by_id[i]["result"]["structuredContent"]["stored"] for i in (10, 11, 12))
    assert "Traceback" not in err
    assert conn.execute("SELECT count(*) AS n FROM episodes WHERE agent = 'a'").fetchone()["n"] == 3


def _answers_over_pipes(lines: list[bytes]) -> list[dict]:
    """`memctl mcp` on pipes: its answers to LINES, in the order it wrote them."""
    proc = subprocess.run(
        [memctl_exe(), "mcp", "--agent", "a"],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _serve_pipes(lines: list[bytes]) -> dict:
    return {a.get("id"): a for a in _answers_over_pipes(lines)}


def test_pipes_carry_a_large_answer_and_a_bad_line_is_no_harm(conn, memctl_env):
    """On pipes (the event loop's own path): a 1 MiB episode in, and its whole text out again; a line of
    invalid UTF-8 that is not JSON either is answered or dropped, and the server goes on."""
    big = "word " * (200 * 1024) + "end"  # 1,000 KiB, under [limits] episode_bytes
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": big}},
    }
    first = _serve_pipes(
        [json.dumps(m).encode() for m in INITIALIZE]
        + [b"\xff\xfe not json", json.dumps(call).encode()]
    )
    stored = first[2]["result"]["structuredContent"]
    assert stored["stored"] is True
    get = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "episode_get", "arguments": {"id": stored["id"]}},
    }
    second = _serve_pipes([json.dumps(m).encode() for m in INITIALIZE + [get]])
    assert second[3]["result"]["structuredContent"]["content"] == big


def test_a_client_that_stops_reading_ends_the_server_quietly(memctl_env):
    """The client's end of our output closed before any answer: one warning line, exit 0, no traceback
    (was a BrokenPipeError's traceback and exit 1)."""
    calls = [
        {
            "jsonrpc": "2.0",
            "id": 10 + i,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "disk full " * 50, "k": 50}},
        }
        for i in range(20)
    ]
    proc = subprocess.Popen(
        [memctl_exe(), "mcp", "--agent", "a"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    proc.stdout.close()
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in INITIALIZE + calls).encode())
    proc.stdin.close()
    assert proc.wait(120) == 0
    err = proc.stderr.read().decode()
    assert "Traceback" not in err and "the client stopped reading" in err
    assert all(line.startswith("memctl: ") for line in err.splitlines()), err


def test_an_overlong_request_line_is_answered_as_an_error_and_the_server_reads_on(conn, memctl_env):
    """The line bound follows [limits]: at the smallest episode_bytes (128 KiB) a 4 MiB line is more than
    any request can be; it is skipped whole, and the next request is answered."""
    with open(memctl_env["MEMCTL_CONFIG"], "w") as file:
        file.write("[limits]\nepisode_bytes = 131072\nvalue_bytes = 4096\n")
    overlong = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": "x" * (4 << 20)}},
    }
    after = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": "the line after the long one"}},
    }
    answers = _answers_over_pipes([json.dumps(m).encode() for m in INITIALIZE + [overlong, after]])
    assert [a.get("id") for a in answers] == [
        1,
        None,
        3,
    ]  # never parsed, so never a request: no id to answer
    refused = answers[1]
    assert (
        refused["error"]["code"] == -32600
        and "longer than the server reads" in refused["error"]["message"]
    )
    assert "result" not in refused and answers[2]["result"]["structuredContent"]["stored"] is True
    contents = [
        r["content"]
        for r in conn.execute("SELECT content FROM episodes WHERE agent = 'a'").fetchall()
    ]
    assert contents == ["the line after the long one"]
