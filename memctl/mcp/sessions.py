"""Whose memory an MCP server serves (Scope), and the connections its tool calls run on (Session).

A scope names the agent, its namespace and the shared ones it reads, and whether it writes; every
statement of a call says so itself (docs/mcp.md). A session holds the settings, the scope and the
connections, proven alive and reopened when broken, each call in the agent's role when it is
registered (docs/agents.md).
"""

from __future__ import annotations

import select
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from memctl.config import Settings, mask_secrets
from memctl.errors import DatabaseUnavailable, MemctlError, UsageError
from memctl.records import facts
from memctl.write import gate, values

if TYPE_CHECKING:
    from memctl.db.memory import Memory


# ---------------------------------------------------------------------------
# Scope


def _name(value: str | None, what: str) -> str | None:
    return values.name(value, f"--{what}", optional=True)  # the write path's rule for a name


@dataclass(frozen=True)
class Scope:
    """Whose memory a server serves. agent None: the operator's view (every agent, any
    namespace)."""

    agent: str | None
    namespace: str
    shared: tuple[str, ...] = ()
    read_only: bool = False
    source: str = "mcp"

    @classmethod
    def make(
        cls,
        *,
        agent: str | None = None,
        namespace: str | None = None,
        shared: list[str] | None = None,
        read_only: bool = False,
        source: str | None = None,
    ) -> "Scope":
        agent, namespace = _name(agent, "agent"), _name(namespace, "namespace")
        source = _name(source, "source")
        names = tuple(dict.fromkeys(values.name(ns, "--shared-namespace") for ns in shared or ()))
        if agent is None and names:
            raise UsageError(
                "--shared-namespace needs --agent: the operator's view reads every "
                "namespace already"
            )
        own = namespace or agent or facts.DEFAULT_NAMESPACE
        return cls(
            agent,
            own,
            tuple(ns for ns in names if ns != own),
            read_only,
            source or (f"mcp:{agent}" if agent else "mcp"),
        )

    @property
    def writer(self) -> str:
        """The agent remembered episodes belong to."""
        return self.agent or gate.DEFAULT_AGENT

    def readable(self, namespace: str | None) -> str:
        if namespace is None or namespace == self.namespace:
            return self.namespace
        if self.agent is None or namespace in self.shared:
            return namespace
        raise UsageError(
            f"namespace {namespace!r} is not readable by this server: it reads {self._namespaces()}"
        )

    def writable(self, namespace: str | None) -> str:
        if namespace is None or namespace == self.namespace or self.agent is None:
            return namespace or self.namespace
        raise UsageError(
            f"namespace {namespace!r} is not writable by this server: it writes only "
            f"{self.namespace!r}"
        )

    def _namespaces(self) -> str:
        shared = f" and, read-only, {', '.join(map(repr, self.shared))}" if self.shared else ""
        return f"{self.namespace!r}{shared}"

    def describe(self) -> str:
        """One line for stderr at start, and the server's instructions to the client."""
        mode = (
            "; read-only: no tool writes"
            if self.read_only
            else f"; writes as source {self.source!r}"
        )
        if self.agent is None:
            return (
                "no --agent: the operator's view, every agent's episodes and facts in any "
                f"namespace (default {self.namespace!r}){mode}"
            )
        return (
            f"agent {self.agent!r}: its episodes only, facts in namespace "
            f"{self._namespaces()}{mode}"
        )


# ---------------------------------------------------------------------------
# The session: connections held and reopened, each call in the agent's role when it is registered

PING = "SELECT 1"


class Stale(DatabaseUnavailable):
    """A call that only reads failed on an idle connection taken unproven (Session.connection): run
    it again."""


def _quiet(conn: Memory) -> bool:
    """Whether an idle, open connection's socket has nothing to read. A server that restarted, or
    ended the session, has sent its last words or closed the socket, which makes it readable; a
    quiet one is most likely alive (a silent network cut hangs a ping as long as the call's own
    first statement)."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return mask_secrets(text.splitlines()[0] if text else type(exc).__name__)


class Session:
    """What every tool call shares: settings, scope, and connections, held and reopened when broken.

    `open_connection` opens the configured database as its owner (starting the embedded server when
    it is not running, migrating), so a server that was stopped between two calls is started again
    on demand. A registered agent's calls run in its role (memctl.records.agents): the first
    statement of every call is SET ROLE, so row-level security keeps the call to the agent's rows
    whatever the statements after it say, and a role revoked since is refused at the next call.
    `role` fixes the role (the HTTP server, which resolved the agent from its token); otherwise the
    registry is asked when a connection opens. `connections`: how many calls run at once (stdio: one
    at a time).
    """

    def __init__(
        self,
        settings: Settings,
        scope: Scope,
        open_connection: Callable[[], Any],
        *,
        role: str | None = None,
        connections: int = 1,
    ):
        self.settings = settings
        self.scope = scope
        self._open = open_connection
        self.role = role
        self._idle: list[Any] = []
        self._slots = threading.BoundedSemaphore(connections)
        self._lock = threading.Lock()
        self._size = connections

    @property
    def track(self) -> bool:
        """Whether hits count as accessed: not on a read-only server, which writes nothing."""
        return not self.scope.read_only

    @contextmanager
    def connection(self, *, rerun: bool = False) -> Iterator[Any]:
        """A live connection for one call; a database failure becomes memctl's error.

        An idle connection is proven alive by a round trip first (SELECT 1, or SET ROLE in an
        agent's role). `rerun`: the call only reads, and protocol.answer may run it again. It then
        takes an idle connection unproven when its socket is quiet (_quiet), saving the round trip;
        should the server have ended the connection a moment before after all, the call fails with
        Stale, having changed nothing."""
        import psycopg

        with self._slots:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            unproven = rerun and conn is not None and self.role is None and _quiet(conn)
            try:
                conn = conn if unproven else self._live(conn)
                yield conn
            except psycopg.OperationalError as exc:
                conn = self._drop(conn)
                failure = Stale if unproven else DatabaseUnavailable
                raise failure(f"database unavailable: {_first_line(exc)}") from None
            except psycopg.Error as exc:
                if conn is not None and (conn.closed or conn.broken):
                    conn = self._drop(conn)
                raise MemctlError(f"database error: {_first_line(exc)}") from None
            finally:
                if conn is not None:
                    with self._lock:
                        self._idle.append(conn)

    def _ping(self, conn: Memory) -> None:
        if self.role is None:
            conn.execute(PING)
        else:
            conn.as_agent(self.role)

    def _live(self, conn: Memory | None):
        import psycopg

        if conn is not None and not conn.closed and not conn.broken:
            try:
                self._ping(conn)
                return conn
            except psycopg.OperationalError:  # restarted or cut off since the last call: reopen
                pass
            except psycopg.Error as exc:  # the role is gone (revoked): refused in memctl's words
                self._drop(conn)
                raise MemctlError(
                    f"agent {self.scope.agent!r} is no longer registered "
                    f"({_first_line(exc)}): `memctl agent add {self.scope.agent}` "
                    "registers it again"
                ) from None
        self._drop(conn)
        conn = self._open().use_settings(self.settings)  # a handle with the session's settings
        try:
            if self.role is None and self.scope.agent is not None:
                self.role = registered_role(conn, self.scope.agent)
            self._ping(conn)
        except BaseException:
            self._drop(conn)
            raise
        return conn

    @staticmethod
    def _drop(conn: Memory | None) -> None:
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        return None

    def close(self) -> None:
        """At exit; a call still running has a few seconds, then exit goes on without it."""
        wait = 5 if self._size == 1 else 0.5
        taken = sum(1 for _ in range(self._size) if self._slots.acquire(timeout=wait))
        try:
            with self._lock:
                idle, self._idle = self._idle, []
            for conn in idle:
                self._drop(conn)
        finally:
            for _ in range(taken):
                self._slots.release()


def registered_role(conn: Memory, agent: str) -> str | None:
    """The agent's role when it is registered; None when no agent is registered in this database
    (memctl's SQL scope alone, as before agents had roles); refused when others are and it is
    not."""
    from memctl.records import agents

    found = agents.show(conn, agent, missing_ok=True)
    if found is not None:
        return found.role
    if agents.list_agents(conn):
        raise MemctlError(
            f"agent {agent!r} is not registered, and agents here run in their own "
            f"roles: `memctl agent add {agent}` registers it"
        )
    return None
