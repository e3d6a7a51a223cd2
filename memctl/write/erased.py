"""The erasure ledger on the way in: this installation's key, and what an import must not bring back.

`memctl import`, `episode import` and `ingest` store their episodes through one writer
(memctl.write.store.copy_episodes), which asks `Lookup` before it copies a batch: a record whose text the ledger
holds the keyed digest of (an episode deleted, purged, pruned from a blocked source, or rewritten by a redaction
fix) is left out and counted (Copied.erased), whatever the file or the command line says: no option brings an
erased record back. `memctl import` also reads `Ledger`: a fact value an erasure cleared is cleared again (so the
history merges into the erased one and adds nothing), a runbook run whose output the ledger holds keeps its outcome
only, and lineage digests come in keyed (memctl.places.lineage_digest). An entry made under another key (a lost
key file) cannot be tested: its records are not recognised.

The key is MEMCTL_HOME/erasure/key (memctl.places.load_key): outside the database, so a dump or a stolen backup
cannot confirm a guess against a digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, overload

from memctl import places
from memctl.errors import BadValue, MemctlError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

ERASED_ID = (
    0  # what an import maps a left-out record's id to: no episode has it (identity ids start at 1)
)


def state_dir() -> Path:
    """MEMCTL_HOME/erasure: beside the embedded data directory, outside the database (also for an operator's own
    PostgreSQL, whose data directory memctl cannot reach)."""
    from memctl.db import embedded

    return embedded.memctl_home() / "erasure"


def key_path() -> Path:
    from memctl.db import embedded

    return places.key_file(embedded.memctl_home())


@overload
def load_key(*, create: Literal[True] = True) -> bytes: ...
@overload
def load_key(*, create: bool) -> bytes | None: ...
def load_key(*, create: bool = True) -> bytes | None:
    """The installation's digest key; made (0600) when missing and `create`."""
    return places.load_key(key_path(), create=create)


HELD = """
SELECT DISTINCT d.digest FROM erasure_digests d JOIN erasures e ON e.id = d.erasure
WHERE d.kind = %(kind)s AND e.key_id = %(kid)s AND d.digest = ANY(%(digests)s)
"""


class Lookup:
    """Which of these texts the ledger holds, asked in one statement (inside a pipeline: read by kept() after it).
    `digests`: theirs under `key`, made by the caller (an import's parsing thread, while the copying one waits
    on the server), else made here."""

    def __init__(
        self,
        conn: Memory,
        texts: Iterable[str],
        kind: str = "episode",
        key: bytes | None = None,
        digests: list[str] | None = None,
    ):
        texts = list(texts)
        key = key if key is not None else readable_key(conn)
        if key is None:
            self.digests = [""] * len(texts)
        else:
            self.digests = (
                digests if digests is not None else [places.digest(key, t) for t in texts]
            )
        self.cursor = (
            conn.execute(HELD, {"kind": kind, "kid": places.key_id(key), "digests": self.digests})
            if key is not None and texts
            else None
        )

    def kept(self) -> list[bool]:
        """Per text: True unless the ledger holds it."""
        held = {r["digest"] for r in self.cursor.fetchall()} if self.cursor is not None else set()
        return [d not in held for d in self.digests]


ANY_ENTRY = "SELECT EXISTS (SELECT 1 FROM erasures) AS yes"


def readable_key(conn: Memory) -> bytes | None:
    """The key (None: none yet, nothing was ever erased from this MEMCTL_HOME). A key this user cannot read is
    an error only where the ledger holds entries: what they erased could not be kept out."""
    try:
        return load_key(create=False)
    except MemctlError:
        if conn.one(ANY_ENTRY)["yes"]:
            raise
        return None


def held(conn: Memory, text: str) -> bool:
    """Whether the ledger holds this text: for a record a writer refuses (its source blocked since, a secret), which
    an import then leaves out as erased instead of failing on it."""
    return not Lookup(conn, [text]).kept()[0]


ERASED_FACTS = """
SELECT f->>'namespace' AS namespace, f->>'key' AS key, d #>> '{}' AS digest
FROM erasures e CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(coalesce(e.items->'facts', '[]')) AS f
CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(coalesce(f->'digests', '[]')) AS d
WHERE e.key_id = %s AND coalesce((f->>'erased')::boolean, true)
"""
# A source pruned before the export: an episode here with its digest (plain in an older file, keyed in a newer one)
# and time. By created_at, which is indexed.
FIND_PLAIN = (
    "SELECT id FROM episodes WHERE agent = %s AND content_hash = %s AND created_at = %s LIMIT 1"
)
FIND_KEYED = (
    "SELECT id FROM episodes WHERE agent = %(agent)s AND created_at = %(at)s AND "
    + places.lineage_sql("content_hash")
    + " = %(given)s LIMIT 1"
)


class Ledger:
    """What `memctl import` reads of the ledger, once per import: the key, the erased facts' digests by key.

    `digest_key`: the key id an export's header names (None: a file written before lineage was keyed, whose
    source_hash values are plain sha256 digests, rekeyed here)."""

    def __init__(self, conn: Memory, digest_key: Any):
        if digest_key is not None and not isinstance(digest_key, str):
            raise BadValue("header: digest_key must be a string", "digest_key")
        self.conn, self.given_key = conn, digest_key
        self.key = load_key()
        self.key_id = places.key_id(self.key)
        self.facts: dict[tuple[str, str], set[str]] = {}
        for row in conn.execute(ERASED_FACTS, (self.key_id,)).fetchall():
            self.facts.setdefault((row["namespace"], row["key"]), set()).add(row["digest"])

    def clear_facts(self, item: dict) -> int:
        """Clear, in a fact record's history, every value an erasure of its key cleared; how many."""
        key = item.get("key")
        held = (
            self.facts.get((item.get("namespace") or "default", key))
            if isinstance(key, str)
            else None
        )
        cleared = 0
        if not held or not isinstance(item.get("history"), list):
            return 0
        for entry in (e for e in item["history"] if isinstance(e, dict)):
            for field in ("old_value", "new_value"):
                if (
                    isinstance(entry.get(field), str)
                    and places.digest(self.key, entry[field]) in held
                ):
                    entry[field] = None
                    cleared += 1
        if isinstance(item.get("value"), str) and places.digest(self.key, item["value"]) in held:
            item["value"] = None
        return cleared

    def erase_run(self, row: dict, episode_id: int | None) -> tuple[int | None, bool]:
        """A runbook run record's episode link and whether its output is one the ledger holds (then [erased])."""
        output = row.get("output_tail")
        quoted = (
            isinstance(output, str) and not Lookup(self.conn, [output], "quote", self.key).kept()[0]
        )
        if quoted or episode_id == ERASED_ID:
            row["output_tail"] = places.ERASED if quoted else output
            return None, True
        return episode_id, False

    def lineage(self, given: Any) -> bytes:
        """A lineage record's source_hash as stored here: keyed under this installation's key."""
        if not isinstance(given, str):
            raise BadValue("source_hash: must be hex", "source_hash")
        try:
            value = bytes.fromhex(given)
        except ValueError:
            raise BadValue("source_hash: must be hex", "source_hash") from None
        return places.lineage_digest(self.key, value) if self.given_key is None else value

    def find_source(self, agent: str, given: str, created_at) -> int | None:
        """The episode here that a pruned source of the file is (same agent, time and digest), if any."""
        if self.given_key is None:
            row = self.conn.execute(
                FIND_PLAIN, (agent, bytes.fromhex(given), created_at)
            ).fetchone()
        elif self.given_key == self.key_id:
            ipad, opad = places.pads(self.key)
            row = self.conn.execute(
                FIND_KEYED,
                {
                    "agent": agent,
                    "at": created_at,
                    "given": bytes.fromhex(given),
                    "ipad": ipad,
                    "opad": opad,
                },
            ).fetchone()
        else:  # keyed under another installation's key: nothing here can be matched to it
            row = None
        return row["id"] if row else None
