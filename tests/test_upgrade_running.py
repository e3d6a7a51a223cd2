"""Long-running processes across an upgrade: `memctl ingest --follow`, `memctl embed --loop` and `memctl mcp --http`,
started before a newer memctl migrates the memory, stop cleanly with exit 75 (which their systemd units take as a
clean stop and restart: SuccessExitStatus= and RestartForceExitStatus=), and no acknowledged write is lost: what
they had stored stays, what they had not acknowledged is stored once by the process started again. `memctl db
serve` holds no schema: it serves on (tests/test_db_serve.py covers its own life).

The newer memctl is played by a real migration this memctl does not know (9000_future.sql, applied by
memctl.db.migrate from a copy of sql/ with it added); the process started again stands for the memctl that knows it,
so the migration's record is taken back first.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from memctl import config, db
from memctl.db import migrate
from memctl.errors import EXIT_SCHEMA_CHANGED
from memctl.records import episodes

FUTURE = "9000_future.sql"


@pytest.fixture
def db_url(agents_db_url):
    """An owner that may make agents' roles (the HTTP server's test registers one)."""
    return agents_db_url


def _exe() -> str:
    beside = Path(sys.executable).parent / "memctl"
    return str(beside) if beside.exists() else shutil.which("memctl")


def _migrate_to_the_future(url: str, tmp_path: Path):
    """A newer memctl's migration, applied: the connection that applied it (it declares that schema)."""
    newer = tmp_path / "newer-sql"
    shutil.copytree(migrate.sql_dir(), newer)
    (newer / FUTURE).write_text("CREATE TABLE memctl_future_test (x int);\n")
    conn = db.connect(url)
    assert [m.name for m in migrate.apply(conn, newer)] == [FUTURE]
    return conn


def _back_to_today(conn) -> None:
    conn.execute("DELETE FROM memctl_migrations WHERE name = %s", (FUTURE,))
    conn.execute("DROP TABLE memctl_future_test")
    conn.close()


def _wait(predicate, seconds: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _count(url: str, query: str, params=()) -> int:
    with db.connect(url) as conn:
        return conn.execute(query, params).fetchone()["n"]


def _start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen(
            [_exe(), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **env},
        )


def _stopped(proc: subprocess.Popen, log: Path) -> str:
    code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == EXIT_SCHEMA_CHANGED, text
    assert "schema" in text and "Traceback" not in text, text
    return text


LOGGED = "SELECT count(*) AS n FROM episodes WHERE source = 'app-log'"


def test_ingest_follow_stops_at_a_migration_and_resumes_losing_nothing(
    memctl_env, db_url, tmp_path
):
    log, cursor, err = tmp_path / "app.log", tmp_path / "app.cursor", tmp_path / "ingest.err"
    log.write_text("".join(f"request {n} served\n" for n in range(3)))
    args = [
        "ingest",
        str(log),
        "--follow",
        "--group",
        "none",
        "--source",
        "app-log",
        "--cursor-file",
        str(cursor),
        "--flush",
        "0.2",
    ]
    proc = _start(args, memctl_env, err)
    try:
        _wait(lambda: _count(db_url, LOGGED) == 3, what="the first lines stored")
        newer = _migrate_to_the_future(db_url, tmp_path)
        with open(log, "a") as handle:
            handle.write("".join(f"request {n} served\n" for n in range(3, 6)))
        _stopped(proc, err)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (
        _count(db_url, LOGGED) == 3
    )  # the refused batch was not acknowledged: nothing of it stored
    _back_to_today(newer)
    again = _start(args, memctl_env, err)
    try:
        _wait(lambda: _count(db_url, LOGGED) == 6, what="the rest stored after the restart")
    finally:
        again.terminate()
        assert again.wait(timeout=30) == 143  # SIGTERM: a clean stop (README, exit codes)
    with db.connect(db_url) as conn:
        texts = [
            r["content"]
            for r in conn.execute(
                "SELECT content FROM episodes WHERE source = 'app-log' ORDER BY id"
            )
        ]
    assert texts == [f"request {n} served" for n in range(6)]  # each once, in order


QUEUED = "SELECT count(*) AS n FROM embed_queue"


def test_embed_loop_stops_at_a_migration_and_the_queue_waits_for_the_next(
    memctl_env, db_url, tmp_path
):
    settings = config.load()
    with db.connect(db_url) as conn:
        for n in range(2):
            episodes.add(conn.use_settings(settings), f"before the upgrade {n}")
    err = tmp_path / "embed.err"
    proc = _start(["embed", "--loop", "--interval", "1"], memctl_env, err)
    try:
        _wait(
            lambda: (
                _count(db_url, "SELECT count(*) AS n FROM embedding_models") == 1
                and _count(db_url, QUEUED) == 0
            ),
            what="the first pass",
        )
        newer = _migrate_to_the_future(db_url, tmp_path)
        for n in range(2):
            episodes.add(newer.use_settings(settings), f"after the upgrade {n}")
        _stopped(proc, err)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _count(db_url, QUEUED) == 2  # still queued, for the memctl started again
    _back_to_today(newer)
    again = _start(["embed", "--loop", "--interval", "1"], memctl_env, err)
    try:
        _wait(lambda: _count(db_url, QUEUED) == 0, what="the queue drained after the restart")
    finally:
        again.terminate()
        assert again.wait(timeout=30) == 143  # SIGTERM: a clean stop (README, exit codes)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remember(url: str, token: str, text: str) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"content": text}},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
    }
    return httpx2.post(url, json=body, headers=headers, timeout=30).json()["result"]


def _not_acknowledged(url: str, token: str, text: str) -> str:
    """How the server turned down a call sent after a newer memctl migrated the memory; fails on an
    acknowledgement. Its schema watch asks every WATCH_S (5 s): on a loaded machine the migration can
    take longer, so the server may have seen it first and be stopping (an error answer) or gone (refused
    connection), instead of refusing the call's write itself. Each is an answer that stores nothing."""
    try:
        answer = _remember(url, token, text)
    except httpx2.ConnectError:
        return "gone"
    except KeyError:  # a JSON-RPC error, not a tool's result: the server is stopping
        return "stopping"
    assert answer.get("isError") and "schema" in answer["content"][0]["text"], answer
    return "refused"


def test_mcp_http_stops_at_a_migration_and_acknowledges_only_what_it_stored(
    memctl_env, db_url, tmp_path, memctl_bin
):
    name = f"upgrade_{os.getpid()}"
    added = memctl_bin("agent", "add", name, env=memctl_env)
    if added.exit_code != 0 and "may not create roles" in added.stderr:
        pytest.skip(f"needs an owner that may make an agent's role: {added.stderr.strip()}")
    assert added.exit_code == 0, added.stderr
    token = memctl_bin("agent", "token", name, env=memctl_env).stdout.strip()
    port, err = _port(), tmp_path / "http.err"
    proc = _start(["mcp", "--http", f"127.0.0.1:{port}"], memctl_env, err)
    url, newer = f"http://127.0.0.1:{port}/mcp", None
    try:
        _wait(
            lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0,
            what="the server listening",
        )
        stored = _remember(url, token, "remembered before the upgrade")
        assert not stored.get("isError"), stored
        newer = _migrate_to_the_future(db_url, tmp_path)
        _not_acknowledged(url, token, "sent after the upgrade")
        _stopped(proc, err)
        remembered = [
            r["content"]
            for r in newer.execute("SELECT content FROM episodes WHERE agent = %s", (name,))
        ]
        assert remembered == ["remembered before the upgrade"]
    finally:
        if proc.poll() is None:
            proc.kill()
        if newer is not None:
            _back_to_today(newer)
        memctl_bin("agent", "revoke", name, env=memctl_env)
