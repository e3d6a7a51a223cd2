"""A record stored once: an import or ingest run twice changes nothing (docs/ingest.md).

Two imported records are the same record when they have the same agent, source, time and content: the
admitted content (after redaction, so no digest of a secret is kept), the source as stored, and the time
as the input gave it (microseconds, UTC). A record whose input gave no time is told by its occurrence in
the stream instead: the first record with that agent, source and content and no time is occurrence 1,
the next 2, and so on, so a file holding the same line twice stores it twice (the second folded as a
repeat, docs/repeats.md) and importing that file again stores neither. Kind, importance and meta are
not part of it: a record read again with another kind is still the record already stored.

Its key (`record_key`, sql/0021) is 16 bytes of sha256, unique per agent. `episode add` and summaries store
none; `memctl export` writes it and `memctl import` stores it as the file gives it (never recomputed), so a
database filled from an export recognises the records the exporting database had imported. A repeat (same
text at another time) is not the same record: it is still folded.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from memctl.db.memory import Memory

KEY_BYTES = 16
UTC = datetime.timezone.utc
# One look-up per agent in the batch (an index probe per key: sql/0021), all in one round trip (ask());
# under the imports' lock (memctl.write.repeats.LOCK_IMPORTS), so two imports of one file cannot
# both find a key missing.
STORED = "SELECT record_key, id FROM episodes WHERE agent = %s AND record_key = ANY(%s)"


def key(
    agent: str,
    source: str | None,
    given: datetime.datetime | None,
    occurrence: int,
    content_hash: bytes,
) -> bytes:
    """The key of an admitted record: `given` its time as the input gave it (None: `occurrence` counts)."""
    when = (
        given.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        if given is not None
        else f"#{occurrence}"
    )
    text = "\x00".join((agent, "\x01" if source is None else "s" + source, when))
    return hashlib.sha256(text.encode("utf-8") + b"\x00" + content_hash).digest()[:KEY_BYTES]


class Occurrences:
    """Counts the untimed records of one stream (memory: one entry per distinct untimed record)."""

    def __init__(self) -> None:
        self._seen: dict[bytes, int] = {}

    def key(
        self, agent: str, source: str | None, given: datetime.datetime | None, content_hash: bytes
    ) -> bytes:
        if given is not None:
            return key(agent, source, given, 0, content_hash)
        base = key(agent, source, None, 0, content_hash)
        n = self._seen.get(base, 0) + 1
        self._seen[base] = n
        return key(agent, source, None, n, content_hash)


def ask(conn: Memory, agents: list[str], keys: Sequence[bytes | None]) -> list:
    """The look-ups of the batch's keys, one per agent (call in a pipeline: they go in one round trip); the
    imports' lock first, so two imports of one file cannot both find a key missing (held until the commit)."""
    from memctl.write.repeats import IMPORT_CLASS, LOCK_IMPORTS

    by_agent: dict[str, list[bytes]] = {}
    for agent, k in zip(agents, keys):
        if k is not None:  # a record with no key (memctl import of an older export) asks nothing
            by_agent.setdefault(agent, []).append(k)
    conn.execute(LOCK_IMPORTS, (IMPORT_CLASS, ""))
    return [
        (agent, conn.execute(STORED, (agent, wanted))) for agent, wanted in sorted(by_agent.items())
    ]


def unseen(asked: list, agents: list[str], keys: Sequence[bytes | None]) -> list[bool]:
    """Per record (from ask()'s answers): True when no stored episode of its agent has its key and no earlier
    record of the batch does; always for a record with no key."""
    stored: set[tuple[str, bytes | None]] = {
        (agent, bytes(row["record_key"])) for agent, cursor in asked for row in cursor.fetchall()
    }
    keep = []
    for agent, k in zip(agents, keys):
        fresh = k is None or (agent, k) not in stored
        stored.add((agent, k))
        keep.append(fresh)
    return keep
