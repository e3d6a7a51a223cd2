"""The memory handle: a psycopg connection (dict rows) that carries what memctl's statements run with.

Every library function that reaches the database takes a Memory. What changes the SQL it runs is an
attribute declared here and changed by the methods here, never an attribute stuck onto a psycopg
object: the settings, the agent role the session is in, where access counts are written from a
replica, the search's scan settings, and the gates writing on it (README.md "Architecture").
memctl.db.connect makes one; tests and tools that open their own connection do so through it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

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

    def report(self, message: str) -> None: ...  # a write through writer() failed: said to whoever asked


class Memory(psycopg.Connection[DictRow]):
    """A connection to memory: psycopg's Connection, with dict rows and memctl's session state."""

    settings: Settings | None  # the settings its commands run with, when it was opened with them
    role: str | None  # the agent role the session is in (SET ROLE), None: its login role
    route: Route | None  # a replica's: where the counts of what it read are written
    gates: list[OpenGate]  # gates in their writing() transaction on it

    def __init__(self, pgconn: PGconn, row_factory: RowFactory[Any] = tuple_row):
        super().__init__(pgconn, row_factory)
        self.settings = None
        self.role = None
        self.route = None
        self.gates = []

    def one(self, query: QueryNoTemplate, params: Params | None = None, *, prepare: bool | None = None,
            binary: bool = False) -> DictRow:
        """execute() and its row, for a statement that returns one (an aggregate, a write's RETURNING)."""
        row = self.execute(query, params, prepare=prepare, binary=binary).fetchone()
        assert row is not None, "the statement returned no row"
        return row
