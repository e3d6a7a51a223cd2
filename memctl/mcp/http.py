"""`memctl mcp --http`: one server for every registered agent, on the MCP SDK's streamable HTTP transport.

The SDK serves /mcp (uvicorn and starlette, as MCPServer.run_streamable_http_async does), checks Host
and Origin (DNS rebinding: loopback names, plus the origins the operator allows), and requires a
bearer token on every request through its own auth middleware, which asks TokenVerifier below: the
token's sha256 is looked up in the registry on each request, so a revoked or rotated token is refused
(401) on its next request. Each tool call then runs in its agent's session, whose statements run in
the agent's role (sessions.Session). Stateless: no request relies on a session another request made.

A token is read from the Authorization header only, never from an option or the environment (so never
in `ps`), and is never logged: the verifier keeps only the agent it names, and uvicorn's access log is off.
"""

from __future__ import annotations

import errno
import threading
import time
from typing import Any, Callable

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl

from memctl.config import Settings
from memctl.db import migrate
from memctl.errors import MemctlError, SchemaChanged, UsageError
from memctl.mcp import bounds, principals, protocol, sessions
from memctl.records import agents

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
CONNECTIONS_PER_AGENT = 4  # calls of one agent that run at once; more wait for a connection
WATCH_S = 5.0  # how often the server asks whether a newer memctl migrated the memory under it
TICK_S = 0.25  # how soon it notices a call's write refused for that


def parse_address(value: str) -> tuple[str, int]:
    """[HOST:]PORT, HOST defaulting to 127.0.0.1 (an IPv6 host in brackets: [::1]:8765)."""
    host, _, port = value.rpartition(":")
    host = host or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--http: expected [HOST:]PORT with PORT 1-65535, got {value[:80]!r}")
    return host.strip("[]") if host.startswith("[") else host, int(port)


def security(host: str, origins: list[str]) -> TransportSecuritySettings:
    """Host and Origin checks: loopback names always, the bound host, and the origins the operator allowed."""
    named = [f"[{host}]" if ":" in host else host]
    hosts = list(dict.fromkeys([*LOOPBACK, *named]))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in hosts],
        allowed_origins=[f"http://{h}:*" for h in LOOPBACK] + list(origins),
    )


class Registry:
    """Tokens to agents, and each agent's session (in its role), for one HTTP server."""

    def __init__(self, settings: Settings, open_connection: Callable[[], Any]):
        self.settings = settings
        self._open = open_connection
        self._owner = sessions.Session(
            settings, sessions.Scope.make(), open_connection, connections=2
        )
        self._sessions: dict[tuple, sessions.Session] = {}
        self._lock = threading.Lock()

    def agent_for(self, token: str) -> agents.Agent | None:
        with self._owner.connection() as conn:
            return agents.by_token(conn, token)

    def session_for(self, agent: agents.Agent) -> sessions.Session:
        key = (agent.name, agent.role, agent.namespace, tuple(agent.shared), agent.read_only)
        with self._lock:
            found = self._sessions.get(key)
            if found is None:
                found = self._sessions[key] = sessions.Session(
                    self.settings,
                    principals.scope_of(agent),
                    self._open,
                    role=agent.role,
                    connections=CONNECTIONS_PER_AGENT,
                )
        return found

    def current(self) -> sessions.Session:
        """The session of the agent whose token this request carries (the SDK's auth context)."""
        token = get_access_token()
        if token is None or not token.claims or "agent" not in token.claims:
            raise MemctlError(
                "no agent for this request"
            )  # the SDK's middleware answers 401 before this
        return self.session_for(agents.Agent(**token.claims["agent"]))

    def check_schema(self) -> None:
        """SchemaChanged once the memory's schema is not the one this memctl knows (memctl.db.migrate)."""
        with self._owner.connection() as conn:
            migrate.check_unchanged(conn)

    def grant(self) -> None:
        with self._owner.connection() as conn:
            agents.refuse_citus(conn)
            agents.grant(conn)

    def close(self) -> None:
        for session in [self._owner, *self._sessions.values()]:
            session.close()


class TokenVerifier:
    """The SDK's TokenVerifier: a bearer token is valid while the registry holds its hash."""

    def __init__(self, registry: Registry):
        self.registry = registry

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            agent = await anyio.to_thread.run_sync(self.registry.agent_for, token)
        except MemctlError:
            return None  # the database is down: refused, said in the server's log by the next tool call
        if agent is None:
            return None
        claims = {
            "agent": {
                "name": agent.name,
                "role": agent.role,
                "namespace": agent.namespace,
                "shared": list(agent.shared),
                "read_only": agent.read_only,
            }
        }
        # The SDK keeps `token` on the request; memctl never reads or logs it there.
        return AccessToken(token="-", client_id=agent.name, scopes=[], claims=claims)


def app(registry: Registry, host: str, port: int, origins: list[str]):
    """The starlette app: the SDK's streamable HTTP at /mcp behind its bearer auth (memctl issues the tokens itself,
    so the issuer is this server: no OAuth flow)."""
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    server = protocol.build(
        registry.current,
        scope=sessions.Scope.make(agent="any"),
        describe="each request in its bearer token's agent: its episodes, its namespace and the "
        "shared namespaces it may read",
        token_verifier=TokenVerifier(registry),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(base),
            resource_server_url=AnyHttpUrl(f"{base}/mcp"),
            validate_token_resource=False,
        ),
    )
    return server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        host=host,
        transport_security=security(host, origins),
    )


def serve(
    settings: Settings,
    open_connection: Callable[[], Any],
    host: str,
    port: int,
    *,
    origins: list[str],
    warn: Callable[[str], None],
) -> None:
    import uvicorn

    sock = listening(
        host, port
    )  # before a word is said: a port in use fails here, no server announced
    registry = Registry(settings, open_connection)
    registry.grant()
    if host not in ("127.0.0.1", "localhost", "::1"):
        warn(
            f"mcp: listening on {host}, not loopback: put TLS in front (a reverse proxy) before any network"
        )
    protocol.configure_logging()
    config = uvicorn.Config(
        bounds.only_post(app(registry, host, port, origins)),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        log_config=None,
        **bounds.config_options(settings),
    )
    warn(
        f"mcp: streamable HTTP at http://{'[' + host + ']' if ':' in host else host}:{port}/mcp for every "
        "registered agent, each request in its token's role"
    )
    server = uvicorn.Server(config)
    watch = SchemaWatch(registry, server)
    watch.start()
    try:
        server.run(sockets=[sock])
    finally:
        watch.stop()
        registry.close()
        sock.close()
    if watch.changed is not None:
        raise watch.changed


class SchemaWatch(threading.Thread):
    """Stops the server (its unit restarts it: exit 75) once the memory's schema changed under it: a newer memctl
    migrated it. The database is asked every WATCH_S; a call whose write the schema refused says so at once."""

    def __init__(self, registry: Registry, server):
        super().__init__(name="memctl-schema-watch", daemon=True)
        self.registry, self.server = registry, server
        self.changed: SchemaChanged | None = None
        self._done = threading.Event()

    def run(self) -> None:
        protocol.schema_changed.clear()
        asked = 0.0
        while not self._done.wait(TICK_S):
            if protocol.schema_changed.is_set():
                self.changed = SchemaChanged(
                    migrate.changed_message(
                        "a migration this memctl does not know", migrate.newest()
                    )
                )
            elif time.monotonic() - asked >= WATCH_S:
                asked = time.monotonic()
                try:
                    self.registry.check_schema()
                except SchemaChanged as exc:
                    self.changed = exc
                except MemctlError:
                    pass  # the database is down: the calls say so
            if self.changed is not None:
                self.server.should_exit = True
                return

    def stop(self) -> None:
        self._done.set()


def listening(host: str, port: int):
    """A socket bound to HOST:PORT (as uvicorn would bind it), or MemctlError saying why not (exit 1: under
    systemd the unit restarts and tries again)."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise MemctlError(f"mcp: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise MemctlError(
            f"mcp: cannot listen on {host}:{port}: {exc.strerror or exc}"
            + (" (another server holds it)" if exc.errno == errno.EADDRINUSE else "")
        ) from None
    return sock
