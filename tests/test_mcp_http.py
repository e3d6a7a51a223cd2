"""`memctl mcp --http`: the SDK's streamable HTTP client against the installed memctl, one server, many agents.

Tokens are issued with `memctl agent token` and sent only in the Authorization header; the server's stderr
is checked never to hold one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.test_agents import can_create_roles, db_url  # noqa: F401  (fixtures: an owner that may make roles)
from tests.test_mcp import Served, _exe


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(memctl_env, tmp_path, can_create_roles, memctl_bin):
    """Alice and bob registered with tokens, and `memctl mcp --http` serving them: (url, tokens, stderr path)."""
    tokens = {}
    for name in ("alice", "bob"):
        assert memctl_bin("agent", "add", name).exit_code == 0
        tokens[name] = memctl_bin("agent", "token", name).stdout.strip()
    port = _port()
    log = tmp_path / "http.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([_exe(), "mcp", "--http", f"127.0.0.1:{port}"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **memctl_env})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", tokens, log
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    text = log.read_text()
    assert all(token not in text for token in tokens.values()), "a token reached the log"
    assert "Traceback" not in text, text


@asynccontextmanager
async def as_agent(url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with create_mcp_http_client(headers=headers) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield Served(session)


def _post(url: str, token: str | None, **headers) -> int:
    sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx2.post(url, json=body, headers=sent, timeout=30).status_code


def test_each_token_is_its_agents_memory_and_bad_tokens_get_401(http_server, conn, memctl_bin):
    url, tokens, log = http_server

    async def scenario():
        async with as_agent(url, tokens["alice"]) as alice:
            stored = await alice.ok("remember", content="the osprey backup job failed on disk space")
            assert stored["agent"] == "alice"
            found = await alice.ok("search", query="osprey backup", mode="text")
            assert [r["id"] for r in found["results"]] == [stored["id"]]
            await alice.ok("fact_set", key="db.host", value="10.0.0.1")
        async with as_agent(url, tokens["bob"]) as bob:
            found = await bob.ok("search", query="osprey backup", mode="text")
            assert found["results"] == []
            assert "no episode" in await bob.error("episode_get", id=stored["id"])
            assert "not readable" in await bob.error("fact_get", key="db.host", namespace="alice")

    anyio.run(scenario)
    assert _post(url, None) == 401
    assert _post(url, "mctk_not-a-token") == 401
    assert _post(url, tokens["alice"]) == 200
    assert _post(url, tokens["alice"], Origin="http://evil.example") in (400, 403)
    rotated = memctl_bin("agent", "token", "alice").stdout.strip()
    assert _post(url, tokens["alice"]) == 401 and _post(url, rotated) == 200
    assert memctl_bin("agent", "revoke", "bob").exit_code == 0
    assert _post(url, tokens["bob"]) == 401
    row = conn.execute("SELECT agent, source FROM episodes").fetchone()
    assert row == {"agent": "alice", "source": "mcp:alice"}


def test_bad_addresses_and_options_exit_2(memctl_env):
    for args in (["--http", "notaport"], ["--http", "8080", "--agent", "a"], ["--allow-origin", "http://x"]):
        proc = subprocess.run([_exe(), "mcp", *args], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 2, (args, proc.stderr)


def test_a_read_only_agent_is_offered_no_write_tool_over_http_and_stdio(http_server, memctl_bin, memctl_env, tmp_path):
    url, _, _ = http_server
    assert memctl_bin("agent", "add", "reader", "--read-only").exit_code == 0
    token = memctl_bin("agent", "token", "reader").stdout.strip()
    from mcp import ClientSession as Stdio, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def scenario():
        async with as_agent(url, token) as reader:
            names = await reader.tool_names()
            assert names and not names & {"remember", "fact_set"}, names
            assert "read-only" in await reader.error("remember", content="should not be stored")
        async with as_agent(url, http_server[1]["alice"]) as alice:  # a writer on the same server still writes
            assert {"remember", "fact_set"} <= await alice.tool_names()
        params = StdioServerParameters(command=_exe(), args=["mcp", "--agent", "reader"],
                                       env={**os.environ, **memctl_env})
        with open(tmp_path / "stdio.log", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with Stdio(read, write) as session:
                    await session.initialize()
                    listed = {t.name for t in (await session.list_tools()).tools}
                    assert listed and not listed & {"remember", "fact_set"}, listed

    anyio.run(scenario)


def test_a_port_in_use_fails_before_announcing_a_server(memctl_env):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([_exe(), "mcp", "--http", f"127.0.0.1:{port}"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, **memctl_env})
    assert proc.returncode == 1 and "cannot listen on 127.0.0.1" in proc.stderr, proc.stderr
    assert "streamable HTTP at" not in proc.stderr and "Traceback" not in proc.stderr
