"""One conversion of the values JSON has no type for (memctl.files.jsonl.json_value), read by every
writer of JSON: the commands' json, jsonl and table output (memctl.cli.render), the MCP server's
replies (memctl.mcp.tools, through jsonl.plain) and `memctl export` (memctl.transfer.export.dumps)."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import uuid

import pytest

from memctl.cli import render
from memctl.files import jsonl
from memctl.transfer import export


class Colour(enum.Enum):
    RED = "red"


WHEN = datetime.datetime(2026, 8, 11, 3, 10, tzinfo=datetime.timezone.utc)
# Each value, and what every writer makes of it.
WRITTEN = [
    (WHEN, "2026-08-11T03:10:00+00:00"),
    (WHEN.date(), "2026-08-11"),
    (datetime.timedelta(minutes=1, milliseconds=500), 60.5),
    (decimal.Decimal("2.5"), 2.5),
    (b"\x00\xff", "00ff"),
    (memoryview(b"\x01"), "01"),
    (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    (Colour.RED, "red"),
]


@pytest.mark.parametrize(("value", "written"), WRITTEN, ids=[type(v).__name__ for v, _ in WRITTEN])
def test_every_writer_of_json_writes_a_value_alike(value, written):
    record = {"value": value, "in": [value], "k": ("a", value)}
    expected = {"value": written, "in": [written], "k": ["a", written]}
    assert json.loads(render.to_json(record)) == expected  # --format json, jsonl
    assert json.loads(export.dumps(record)) == expected  # memctl export
    assert jsonl.plain(record) == expected  # the MCP server's structured replies
    assert render._cell(value) == str(written)  # --format table, csv


def test_a_value_with_no_json_form_is_refused_by_every_writer():
    for write in (render.to_json, export.dumps, jsonl.plain):
        with pytest.raises(TypeError, match="cannot write object as JSON"):
            write({"value": object()})
    assert render._cell("text") == "text" and render._cell(3) == "3"
