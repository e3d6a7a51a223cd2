"""`memctl mcp --http` holds what it is given no longer ([http], memctl.mcp.bounds): connections that never
finish their headers are closed, a kept-alive connection that idles is closed, past the total or one client's
limit a connection is answered 503, and `GET /mcp` is answered 405, while a good client still gets answers.

Raw sockets on 127.0.0.1 (the server's address); other clients come from other loopback addresses
(127.0.0.2 and up, which Linux routes to lo), since the per-client limit counts one address's connections.
Small limits keep it short: about 10 s, most of it two header timeouts of 3 s and an idle timeout of 2 s.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest


HEADER_TIMEOUT, IDLE_TIMEOUT, TOTAL, PER_CLIENT = 3, 2, 30, 10
PARTIAL = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # headers that never end


@pytest.fixture
def bounded_server(agents_db_url, memctl_env, tmp_path, memctl_bin, http_server):
    """`memctl mcp --http` with small [http] bounds, and a registered agent's token: (port, token)."""
    memctl_env["MEMCTL_DATABASE_URL"] = agents_db_url
    with open(memctl_env["MEMCTL_CONFIG"], "a") as config:
        config.write(
            f'[http]\nheader_timeout = "{HEADER_TIMEOUT}s"\nidle_timeout = "{IDLE_TIMEOUT}s"\n'
            f"max_connections = {TOTAL}\nmax_connections_per_client = {PER_CLIENT}\n"
        )
    name = f"bounds_{uuid.uuid4().hex[:8]}"
    assert memctl_bin("agent", "add", name, env=memctl_env).exit_code == 0
    token = memctl_bin("agent", "token", name, env=memctl_env).stdout.strip()
    log = tmp_path / "http.log"
    try:
        with http_server(memctl_env, log) as url:
            yield int(url.rsplit(":", 1)[1].split("/")[0]), token
    finally:
        memctl_bin("agent", "revoke", name, env=memctl_env)
    assert "Traceback" not in log.read_text(), log.read_text()


def _open(port: int, source: str, data: bytes = PARTIAL) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(data)
    return sock


def _request(port: int, token: str, method: str = "POST") -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    head = (
        f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    )
    if method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body if method == "POST" else b"")


def _status(sock: socket.socket, wait: float = 30) -> int | None:
    """The status of the answer read from sock; None if it was closed without one."""
    sock.settimeout(wait)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None


def _closed(sock: socket.socket, wait: float) -> bool:
    """Whether the server closes sock within `wait` seconds (a generous bound: this times no one)."""
    sock.settimeout(wait)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _ask(port: int, token: str, source: str, method: str = "POST") -> int | None:
    with _open(port, source, _request(port, token, method)) as sock:
        return _status(sock)


def test_slow_idle_and_surplus_connections_are_closed_while_a_good_client_is_answered(
    bounded_server,
):
    port, token = bounded_server
    # 40 connections that never finish their headers, from one client: PER_CLIENT held, the rest refused at once
    slow = [_open(port, "127.0.0.1") for _ in range(40)]
    time.sleep(0.3)
    assert _ask(port, token, "127.0.0.2") == 200  # another client is answered meanwhile
    refused = [s for s in slow if _status(s, wait=0.5) == 503]
    assert len(refused) == 40 - PER_CLIENT
    held = [s for s in slow if s not in refused]
    assert all(_closed(s, wait=HEADER_TIMEOUT + 20) for s in held), (
        "a connection without headers stayed open"
    )
    for sock in slow:
        sock.close()

    # the total: TOTAL connections of three clients, the next refused; once they time out, answers again
    full = [_open(port, f"127.0.0.{3 + i // PER_CLIENT}") for i in range(TOTAL)]
    time.sleep(0.3)
    assert _ask(port, token, "127.0.0.9") == 503
    assert all(_closed(s, wait=HEADER_TIMEOUT + 20) for s in full)
    for sock in full:
        sock.close()
    assert _ask(port, token, "127.0.0.9") == 200

    # a kept-alive connection that idles is closed; GET /mcp is answered at once, 405
    with _open(port, "127.0.0.10", _request(port, token)) as kept:
        assert _status(kept) == 200
        assert _closed(kept, wait=IDLE_TIMEOUT + 20)
    assert _ask(port, token, "127.0.0.11", method="GET") == 405
