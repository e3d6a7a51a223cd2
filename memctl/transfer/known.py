"""Which episode here a record of an export is: `memctl import`'s dedup (memctl.transfer.import_).

A record is an episode already here when
- it carries a record_key (docs/ingest.md, "A record stored once") and an episode of its agent holds that key:
  the key is the record's identity, whatever its time or text (two copies of one log line, one imported
  here at this database's time, one brought by the export at the other's);
- or an episode of its agent has its content hash and created_at and no key, or (a record with no key: an
  export written before keys were) any key. Two records with one text and time but different keys (the same
  untimed line twice in a log, docs/ingest.md) are two records.
An earlier record of the import counts as here. Found: the episode's id, or a Pending that gets it once the
batch is written.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Union

from memctl.write import identity, repeats

# By created_at, which is indexed (content_hash is not); the hash is compared here.
EXISTING = "SELECT agent, content_hash, created_at, record_key, id FROM episodes WHERE created_at = ANY(%s)"


@dataclass
class Pending:
    """An episode of this batch, its id not taken yet."""

    id: int | None = None


Slot = Union[int, Pending]
Triple = tuple[str, bytes, datetime.datetime]


def resolve(slot: Slot) -> int:
    return slot if isinstance(slot, int) else slot.id


class Known:
    def __init__(self) -> None:
        self.by_time: dict[Triple, list[tuple[bytes | None, Slot]]] = {}
        self.by_key: dict[tuple[str, bytes], Slot] = {}

    def load(self, conn, times: list[datetime.datetime], agents: list[str], keys: list[bytes | None]) -> None:
        """The episodes at the batch's times and those holding its keys, in one round trip. The keys are asked
        under the imports' lock (memctl.write.identity.ask), so no concurrent import stores one after."""
        with repeats.pipeline(conn):
            at_times = conn.execute(EXISTING, (times,))
            asked = identity.ask(conn, agents, keys) if any(k is not None for k in keys) else []
        for row in at_times.fetchall():
            key = bytes(row["record_key"]) if row["record_key"] is not None else None
            self.add((row["agent"], bytes(row["content_hash"]), row["created_at"]), key, row["id"])
        self._keys(asked)

    def ask(self, conn, agents: list[str], keys: list[bytes]) -> None:
        """Keys under agents the first look-up did not ask (an agent name the gate redacted)."""
        with repeats.pipeline(conn):
            asked = identity.ask(conn, agents, keys)
        self._keys(asked)

    def _keys(self, asked: list) -> None:
        for agent, cursor in asked:
            for row in cursor.fetchall():
                self.by_key.setdefault((agent, bytes(row["record_key"])), row["id"])

    def find(self, triple: Triple, key: bytes | None) -> Slot | None:
        if key is not None:
            slot = self.by_key.get((triple[0], key))
            if slot is not None:
                return slot
        for stored, slot in self.by_time.get(triple, ()):
            if key is None or stored is None:
                return slot
        return None

    def add(self, triple: Triple, key: bytes | None, slot: Slot) -> None:
        self.by_time.setdefault(triple, []).append((key, slot))
        if key is not None:
            self.by_key.setdefault((triple[0], key), slot)
