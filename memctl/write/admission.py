"""Admission: the records this process's gates made (memctl.write.gate seals them, the store asks).

The record types are public dataclasses anyone can build, copy (dataclasses.replace) or fill with anything; the
store writes only an object found here under its own id, so a record reaches the store only as a gate made it,
and frozen: as it was admitted. Only memctl.write.gate calls `seal` (tests/test_gate.py checks the source).
"""

from __future__ import annotations

import weakref
from typing import Any

# id -> the record a Gate made (weakly: an entry leaves with its record)
_ADMITTED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def seal(record):
    _ADMITTED[id(record)] = record
    return record


def is_admitted(record: Any, kind: type) -> bool:
    """Whether `record` is a `kind` a gate of this process made (not one built or copied elsewhere)."""
    return isinstance(record, kind) and _ADMITTED.get(id(record)) is record


def admitted(record: Any, kind: type) -> None:
    """Refuse (TypeError) a record no gate made: the store's first check on every record it writes."""
    if not is_admitted(record, kind):
        raise TypeError(f"only an admitted {kind.__name__} is written (got {type(record).__name__} that no gate made): "
                        "pass it through memctl.write.gate.Gate first")
