"""`memctl mcp --http`: the SDK's streamable HTTP client against the installed memctl, one server, many agents.

Tokens are issued with `memctl agent token` and sent only in the Authorization header; the server's stderr
is checked never to hold one.
"""

from __future__ import annotations

import os
import socket
import subprocess

import anyio
import httpx2
import pytest

from tests.fix_mcp import as_agent, serving
from tests.installed import memctl_exe


@pytest.fixture
def db_url(agents_db_url):
    """An owner that may make agents' roles (conftest.agents_db_url)."""
    return agents_db_url


@pytest.fixture
def agents_served(memctl_env, tmp_path, can_create_roles, memctl_bin, http_server):
    """Alice and bob registered with tokens, and `memctl mcp --http` serving them: (url, tokens, stderr path)."""
    tokens = {}
    for name in ("alice", "bob"):
        assert memctl_bin("agent", "add", name).exit_code == 0
        tokens[name] = memctl_bin("agent", "token", name).stdout.strip()
    log = tmp_path / "http.log"
    with http_server(memctl_env, log) as url:
        yield url, tokens, log
    text = log.read_text()
    assert all(token not in text for token in tokens.values()), "a token reached the log"
    assert "Traceback" not in text, text


def _post(url: str, token: str | None, **headers) -> int:
    sent = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    }
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx2.post(url, json=body, headers=sent, timeout=30).status_code


def test_each_token_is_its_agents_memory_and_bad_tokens_get_401(agents_served, conn, memctl_bin):
    url, tokens, log = agents_served

    async def scenario():
        async with as_agent(url, tokens["alice"]) as alice:
            stored = await alice.ok(
                "remember", content="the osprey backup job failed on disk space"
            )
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
    for args in (
        ["--http", "notaport"],
        ["--http", "8080", "--agent", "a"],
        ["--allow-origin", "http://x"],
    ):
        proc = subprocess.run(
            [memctl_exe(), "mcp", *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 2, (args, proc.stderr)


def test_a_read_only_agent_is_offered_no_write_tool_over_http_and_stdio(
    agents_served, memctl_bin, memctl_env, tmp_path
):
    url, tokens, _ = agents_served
    assert memctl_bin("agent", "add", "reader", "--read-only").exit_code == 0
    token = memctl_bin("agent", "token", "reader").stdout.strip()

    async def scenario():
        async with as_agent(url, token) as reader:
            names = await reader.tool_names()
            assert names and not names & {"remember", "fact_set"}, names
            assert "read-only" in await reader.error("remember", content="should not be stored")
        async with as_agent(
            url, tokens["alice"]
        ) as alice:  # a writer on the same server still writes
            assert {"remember", "fact_set"} <= await alice.tool_names()
        async with serving(tmp_path / "stdio.log", "--agent", "reader", env=memctl_env) as stdio:
            listed = await stdio.tool_names()
            assert listed and not listed & {"remember", "fact_set"}, listed

    anyio.run(scenario)


def test_a_port_in_use_fails_before_announcing_a_server(memctl_env):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [memctl_exe(), "mcp", "--http", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **memctl_env},
        )
    assert proc.returncode == 1 and "cannot listen on 127.0.0.1" in proc.stderr, proc.stderr
    assert "streamable HTTP at" not in proc.stderr and "Traceback" not in proc.stderr
