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

What a batch asks: the episodes at its times (with their keys), as before keys were carried. Whether a key
is held by an episode at another time is asked by the store's writer (memctl.write.store.copy_episodes,
under the imports' lock), which skips such a record; only then (`Copied.already`) are the holders of the
batch's keys asked (holders()), so a batch of new records costs no key look-up of its own.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from memctl.write import identity, repeats

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# By created_at, which is indexed (content_hash is not); the hash is compared here.
EXISTING = "SELECT agent, content_hash, created_at, record_key, id FROM episodes WHERE created_at = ANY(%s)"


@dataclass
class Pending:
    """An episode of this batch, its id not taken yet."""

    id: int | None = None


Slot = Union[int, Pending]
Triple = tuple[str, bytes, datetime.datetime | None]  # an episode's agent, content hash and time


def resolve(slot: Slot) -> int:
    if isinstance(slot, int):
        return slot
    assert slot.id is not None  # its batch took its id before any slot is resolved
    return slot.id


class Known:
    def __init__(self) -> None:
        self.by_time: dict[Triple, list[tuple[bytes | None, Slot]]] = {}
        self.by_key: dict[tuple[str, bytes], Slot] = {}

    def load(self, conn: Memory, times: list[datetime.datetime | None]) -> None:
        """The episodes at the batch's times."""
        for row in conn.execute(EXISTING, (times,)).fetchall():
            key = bytes(row["record_key"]) if row["record_key"] is not None else None
            self.add((row["agent"], bytes(row["content_hash"]), row["created_at"]), key, row["id"])

    def find(self, triple: Triple, key: bytes | None) -> Slot | None:
        if key is not None:
            slot = self.by_key.get((triple[0], key))
            if slot is not None:
                return slot
        for stored, slot in self.by_time.get(triple, ()):
            if key is None or stored is None or stored == key:
                return slot
        return None

    def add(self, triple: Triple, key: bytes | None, slot: Slot) -> None:
        self.by_time.setdefault(triple, []).append((key, slot))
        if key is not None:
            self.by_key.setdefault((triple[0], key), slot)


def holders(
    conn: Memory, agents: list[str], keys: list[bytes | None]
) -> dict[tuple[str, bytes], int]:
    """(agent, key) -> the id of the episode holding it, for the batch's keys."""
    with repeats.pipeline(conn):
        asked = identity.ask(conn, agents, keys)
    return {
        (agent, bytes(row["record_key"])): row["id"]
        for agent, cursor in asked
        for row in cursor.fetchall()
    }
