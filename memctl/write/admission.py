"""What a gate admits: the record types of memory, and the seal that tells a gate's record from a
copy (docs/secrets-and-export.md).

The record types are public dataclasses anyone can build or copy (dataclasses.replace); the store
writes only an object found here under its own id, so a record reaches the store only as a gate
(memctl.write.gate) made it. And as it was admitted: every record is frozen whole, what it holds
too (an episode's meta, nested values included, and chunks; a run's row). Only memctl.write.gate
calls `seal` (tests/test_gate.py checks the source).
"""

from __future__ import annotations

import datetime
import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from memctl.write import repeats

# id -> the record a Gate made (weakly: an entry leaves with its record)
_ADMITTED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def seal(record):
    _ADMITTED[id(record)] = record
    return record


def is_admitted(record: Any, kind: type) -> bool:
    """Whether `record` is a `kind` a gate of this process made (not one built or copied
    elsewhere)."""
    return isinstance(record, kind) and _ADMITTED.get(id(record)) is record


def admitted(record: Any, kind: type) -> None:
    """Refuse (TypeError) a record no gate made: the store's first check on every record it
    writes."""
    if not is_admitted(record, kind):
        raise TypeError(
            f"only an admitted {kind.__name__} is written (got {type(record).__name__} "
            "that no gate made): pass it through memctl.write.gate.Gate first"
        )


class ReadOnlyDict(dict):
    """A dict that refuses every change (TypeError): a mapping an admitted record holds. A dict
    still, so json and psycopg's Jsonb write it as one."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("an admitted record cannot be changed: admit a new one through the gate")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type, tuple[dict[Any, Any]]]:
        # copy, deepcopy and pickle make it whole (a dict subclass's default fills it item by item)
        return type(self), (dict(self),)


def frozen(value: Any) -> Any:
    """VALUE with every mapping in it read-only and every list a tuple (JSON writes both alike)."""
    if isinstance(value, Mapping):
        return ReadOnlyDict({key: frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(item) for item in value)
    return value


# --- the records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    """An admitted episode: validated, source allowed, texts redacted, chunks made from its
    content."""

    content: str
    kind: str
    agent: str
    source: str | None
    importance: int
    created_at: datetime.datetime | None
    meta: Mapping[str, Any]  # read-only (frozen), nested values too
    chunks: tuple[str, ...]
    content_hash: bytes
    redacted: bool  # redaction changed a field
    secret: bytes | None = None  # when it did: a keyed digest of the fields as they came
    #                              (repeats.secret_digest)

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", frozen(self.meta))
        object.__setattr__(self, "chunks", tuple(self.chunks))

    @functools.cached_property
    def norm_hash(self) -> bytes:
        """Its fold key (memctl.write.repeats.norm_hash: normalized text, meta, and the digest when
        redacted)."""
        return repeats.norm_hash(self.content, self.meta, self.secret)


@dataclass(frozen=True)
class FactValue:
    """An admitted fact value: namespace, key, value and source checked and redacted."""

    namespace: str
    key: str
    value: str | None
    source: str | None
    valid_from: datetime.datetime | None = None  # when the value became true; None: when recorded


@dataclass(frozen=True)
class HistoryEntry:
    namespace: str
    key: str
    version: int
    op: str
    old_value: str | None
    new_value: str | None
    source: str | None
    changed_at: datetime.datetime | None = None  # system time: when memctl recorded it; None: now
    valid_from: datetime.datetime | None = None  # valid time: when it became true; None: changed_at


@dataclass(frozen=True)
class RunRecord:
    row: Mapping[str, Any]  # read-only (frozen)

    def __post_init__(self) -> None:
        object.__setattr__(self, "row", frozen(self.row))


@dataclass(frozen=True)
class Lineage:
    agent: str
    summary_id: int
    source_id: int
    source_created_at: datetime.datetime
    source_hash: bytes


@dataclass(frozen=True)
class WindowLineage:
    """A summary's lineage: every episode of its window's input (already in memory) to the
    summary."""

    agent: str
    summary_id: int


@dataclass(frozen=True)
class BlockedSource:
    source: str
    reason: str | None
    blocked_at: datetime.datetime | None
