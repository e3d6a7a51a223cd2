"""`memctl import`'s facts: a record's history merged into the key's, each entry through the write gate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from memctl.errors import BadValue
from memctl.records import facts
from memctl.write import admission, gate, store

if TYPE_CHECKING:
    from memctl.db.memory import Memory


class Counts(Protocol):  # memctl.transfer.import_.ImportResult
    fact_changes: int
    facts: int


KEY_HISTORY = """
SELECT version, op, old_value, new_value, source, changed_at FROM fact_history
WHERE namespace = %s AND key = %s ORDER BY version, id
"""


def _history_entries(
    admit: gate.Gate, fact: admission.FactValue, history: Any
) -> list[admission.HistoryEntry]:
    """A fact record's history, each entry through the gate, in version order."""
    if not isinstance(history, list) or not history:
        raise BadValue(f"fact {fact.key!r}: history must be a non-empty list", "history")
    entries = []
    for index, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise BadValue(f"fact {fact.key!r}: history[{index}] must be an object", "history")
        if entry.get("changed_at") is None:
            raise BadValue(f"fact {fact.key!r}: history[{index}] needs changed_at", "history")
        entries.append(
            admit.history(
                fact,
                entry.get("version"),
                entry.get("op"),
                entry.get("old_value"),
                entry.get("new_value"),
                entry.get("source"),
                entry["changed_at"],
                entry.get("valid_from"),
            )
        )  # absent (older files): changed_at
    return sorted(entries, key=lambda e: e.version)


def merge_fact(conn: Memory, admit: gate.Gate, item: dict, result: Counts) -> None:
    """Add a key's history: as it is on an empty key; else the entries not yet here, after the last version.

    The current row is then the merged history's (memctl.records.facts: the greatest valid_from wins)."""
    if (
        item.get("value") is not None
    ):  # the current value is the history's: admitted (and counted) there alone
        gate.check_value(item["value"], "value", admit.limits.value_bytes)
    fact = admit.fact(
        item["namespace"], item["key"], None, item.get("source"), item.get("valid_from")
    )
    entries = _history_entries(admit, fact, item["history"])
    if (
        item.get("version") is not None
    ):  # checked where they enter; the current row comes from the history
        gate.integer(item["version"], "version", 1, 2**62)
    if item.get("updated_at") is not None:
        gate.parse_time(item["updated_at"], "updated_at")
    namespace, key = fact.namespace, fact.key
    facts.lock_key(conn, namespace, key)
    here = conn.execute(KEY_HISTORY, (namespace, key)).fetchall()
    seen = {(h["op"], h["old_value"], h["new_value"], h["changed_at"]) for h in here}
    new = (
        [e for e in entries if (e.op, e.old_value, e.new_value, e.changed_at) not in seen]
        if here
        else entries
    )
    if not new:
        return
    last = max((h["version"] for h in here), default=0)
    added = []
    for offset, entry in enumerate(new, start=1):
        if here:
            entry = gate.renumbered(entry, last + offset)
        store.insert_history(conn, entry)
        added.append(entry)
    result.fact_changes += len(new)
    result.facts += 1
    _settle(conn, namespace, key, added)


def _settle(conn: Memory, namespace: str, key: str, added: list[admission.HistoryEntry]) -> None:
    """The key's current row after a merge: the winning version's, when the file brought it."""
    winner = conn.execute(
        facts.VERSIONS_AT, facts.at_params(namespace=namespace, key=key), prepare=False
    ).fetchone()
    if winner is None:  # every version erased, or none sets a value
        conn.execute(facts.DELETE, (namespace, key))
        return
    brought = [
        e
        for e in added
        if (e.version, e.op, e.new_value, e.changed_at)
        == (winner["version"], winner["op"], winner["value"], winner["updated_at"])
    ]
    if not brought:
        return  # this database's own version stays the current value
    if winner["op"] == "delete":
        conn.execute(facts.DELETE, (namespace, key))
    else:
        store.put_fact(
            conn, gate.Gate.fact_of(brought[-1]), winner["version"], winner["updated_at"]
        )
