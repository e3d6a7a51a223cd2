"""Fixtures of the MCP tests: the SDK's clients (stdio and streamable HTTP) against the installed `memctl mcp`, and
`memctl mcp --http` on a free loopback port. Loaded through pytest_plugins (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.installed import memctl_exe

# Built at run time, so no scanner mistakes this file for a leak; a shape memctl redacts.
URL_PASSWORD = "Zq7-" + "harbour-" + "lantern-91"


class Served:
    """A live client session to `memctl mcp`, with helpers that unwrap results."""

    def __init__(self, session: ClientSession):
        self.session = session

    async def call(self, tool: str, /, **arguments):
        return await self.session.call_tool(tool, arguments)

    async def ok(self, tool: str, /, **arguments) -> dict:
        result = await self.call(tool, **arguments)
        assert not result.is_error, f"{tool}{arguments}: {text(result)}"
        return result.structured_content

    async def error(self, tool: str, /, **arguments) -> str:
        result = await self.call(tool, **arguments)
        assert result.is_error, f"{tool}{arguments} should have failed: {text(result)}"
        return text(result)

    async def tool_names(self) -> set[str]:
        return {t.name for t in (await self.session.list_tools()).tools}


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


@asynccontextmanager
async def serving(log: Path, *args: str, env: dict | None = None):
    environment = {**os.environ, **(env or {})}
    with open(log, "a") as errlog:
        params = StdioServerParameters(command=memctl_exe(), args=["mcp", *args], env=environment)
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield Served(session)


def run(scenario) -> None:
    anyio.run(scenario)


def stderr_of(log: Path, *secrets: str) -> str:
    """The server's stderr: memctl's lines only, no traceback, none of the secrets."""
    err = log.read_text()
    assert "Traceback" not in err, err
    assert all(line.startswith("memctl: ") for line in err.splitlines()), err
    for secret in secrets:
        assert secret not in err
    return err


@pytest.fixture
def log(tmp_path) -> Path:
    return tmp_path / "mcp-stderr.log"


@asynccontextmanager
async def as_agent(url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with create_mcp_http_client(headers=headers) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield Served(session)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    """http_server(env, log): a context manager running the installed `memctl mcp --http` on a free loopback port,
    its stderr appended to LOG; its URL."""
    return _http_server


@contextlib.contextmanager
def _http_server(env: dict, log: Path):
    port = free_port()
    with open(log, "a") as err:
        proc = subprocess.Popen(
            [memctl_exe(), "mcp", "--http", f"127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **env},
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        time.sleep(0.2)  # the probe is gone before the test counts connections
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
