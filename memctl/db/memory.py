"""The memory handle: a psycopg connection (dict rows) that carries what memctl's statements run with.

Every library function that reaches the database takes a Memory. What changes the SQL it runs is an
attribute declared here and changed by the methods here, never an attribute stuck onto a psycopg
object: the settings, the agent role the session is in, where access counts are written from a
replica, the search's scan settings, and the gates writing on it (README.md "Architecture").
memctl.db.connect makes one; tests and tools that open their own connection do so through it too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import psycopg
from psycopg.rows import DictRow, tuple_row

if TYPE_CHECKING:
    from psycopg.abc import Params, QueryNoTemplate
    from psycopg.pq.abc import PGconn
    from psycopg.rows import RowFactory

    from memctl.config import Settings


class OpenGate(Protocol):
    """A gate in its writing() transaction on this connection (memctl.write.gate.Gate)."""

    def covers(self, source: str | None) -> bool: ...


class Route(Protocol):
    """Where the access counts of a read connection are written (memctl.records.access)."""

    def writer(self) -> Memory | None: ...

    def report(
        self, message: str
    ) -> None: ...  # a write through writer() failed: said to whoever asked


class Memory(psycopg.Connection[DictRow]):
    """A connection to memory: psycopg's Connection, with dict rows and memctl's session state."""

    _settings: (
        Settings | None
    )  # the settings its commands run with (memctl.db.connect(settings=...))
    _role: str | None  # the agent role the session is in (SET ROLE), None: its login role
    _route: Route | None  # a replica's: where the counts of what it read are written
    _gates: list[OpenGate]  # gates in their writing() transaction on it

    def __init__(self, pgconn: PGconn, row_factory: RowFactory[Any] = tuple_row):
        super().__init__(pgconn, row_factory)
        self._settings = None
        self._role = None
        self._route = None
        self._gates = []

    @property
    def settings(self) -> Settings:
        """The settings it was opened with; MemctlError when it was opened without (a caller's mistake)."""
        if self._settings is None:
            from memctl.errors import MemctlError

            raise MemctlError(
                "this memory handle was opened without settings (memctl.db.connect(settings=...))"
            )
        return self._settings

    @property
    def has_settings(self) -> bool:
        return self._settings is not None

    def use_settings(self, settings: Settings | None) -> Memory:
        """Run its commands with `settings` from now on; returns the handle."""
        self._settings = settings
        return self

    @property
    def ef_search(self) -> int:
        """pgvector's hnsw.ef_search for its scans (memctl.reading.scan), from its settings."""
        return self.settings.search.ef_search

    @property
    def role(self) -> str | None:
        """The agent role as_agent() put it in; None: its login role."""
        return self._role

    @property
    def in_agent_role(self) -> bool:
        """Whether as_agent() put it in an agent's role. Only the way words are found depends on it: a
        connection put in a role otherwise (psql's SET ROLE) is still kept to its rows, by the policies."""
        return self._role is not None

    def as_agent(self, role: str) -> None:
        """Run its next statements in `role` (SET ROLE), until as_owner(). Search then finds words through
        memctl_agent_matches (sql/0022), the text index's way in under row-level security."""
        from psycopg import sql

        self.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        self._role = role

    def as_owner(self) -> None:
        """Back to its login role (RESET ROLE)."""
        self.execute("RESET ROLE")
        self._role = None

    @property
    def route(self) -> Route | None:
        """Where the access counts of what it read are written, when not on itself (a replica's)."""
        return self._route

    def route_counts_to(self, route: Route | None) -> None:
        """Write the access counts of what it reads through `route` (memctl.records.access.route_to_primary)."""
        self._route = route

    @property
    def gates(self) -> tuple[OpenGate, ...]:
        """The gates in their writing() transaction on it."""
        return tuple(self._gates)

    @contextmanager
    def gate_open(self, gate: OpenGate) -> Iterator[None]:
        """`gate` counted among its open gates for the block (memctl.write.gate.Gate.writing)."""
        self._gates.append(gate)
        try:
            yield
        finally:
            self._gates.remove(gate)

    def one(
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool = False,
    ) -> DictRow:
        """execute() and its row, for a statement that returns one (an aggregate, a write's RETURNING)."""
        row = self.execute(query, params, prepare=prepare, binary=binary).fetchone()
        assert row is not None, "the statement returned no row"
        return row
