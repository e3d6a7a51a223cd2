"""The one output path: every command that prints rows goes through render()."""

from __future__ import annotations

import csv
import sys
from enum import Enum
from typing import Any, Iterable

from memctl.files import jsonl


class Format(str, Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"
    csv = "csv"


def to_json(value: Any, indent: int | None = None) -> str:
    return jsonl.dumps(value, indent=indent)


# Control characters of stored text (any agent or log line can hold `\x1b]0;title\x07` or `\x1b[2J`) would drive the
# reader's terminal: every human-facing output (tables, text, messages) shows them escaped, as \xNN; tab and
# newline stay (a table cell and a message may hold them). JSON, JSONL and CSV are data and stay exact.
_INERT = {
    c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)
}


def inert(text: str) -> str:
    """TEXT with every C0 control but tab and newline, DEL and every C1 control escaped as \\xNN."""
    return text.translate(_INERT)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return inert(to_json(value))
    try:
        value = jsonl.json_value(value)  # a time, a number, bytes... as json and jsonl write it
    except TypeError:  # a string, a number, anything else: as it is
        pass
    return inert(str(value))


def render(
    rows: Iterable[dict],
    fmt: Format | str = Format.table,
    *,
    columns: list[str] | None = None,
    out=None,
) -> int:
    """Write rows in the chosen format to stdout; returns how many were written.

    json writes one array; jsonl and csv stream row by row.
    """
    out = out or sys.stdout
    fmt = Format(fmt)
    count = 0
    if fmt is Format.jsonl:
        for row in rows:
            out.write(to_json(_pick(row, columns)) + "\n")
            count += 1
        return count
    if fmt is Format.csv:
        writer = None
        for row in rows:
            row = _pick(row, columns)
            if writer is None:
                writer = csv.DictWriter(out, fieldnames=list(row), lineterminator="\n")
                writer.writeheader()
            writer.writerow({k: _cell(v) for k, v in row.items()})
            count += 1
        return count
    materialised = [_pick(row, columns) for row in rows]
    if fmt is Format.json:
        out.write(to_json(materialised, indent=2) + "\n")
    elif materialised:
        from tabulate import tabulate

        table = [{k: _cell(v) for k, v in row.items()} for row in materialised]
        out.write(tabulate(table, headers="keys", disable_numparse=True) + "\n")
    return len(materialised)


def render_one(row: dict, fmt: Format | str = Format.table, out=None) -> None:
    """A single record: json prints an object; table prints field/value lines."""
    out = out or sys.stdout
    fmt = Format(fmt)
    if fmt is Format.json:
        out.write(to_json(row, indent=2) + "\n")
    elif fmt is Format.table:
        from tabulate import tabulate

        out.write(
            tabulate(
                [(k, _cell(v)) for k, v in row.items()], tablefmt="plain", disable_numparse=True
            )
            + "\n"
        )
    else:
        render([row], fmt, out=out)


def _pick(row: dict, columns: list[str] | None) -> dict:
    if columns is None:
        return row
    return {c: row.get(c) for c in columns}
