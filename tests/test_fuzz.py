"""Every input parser fuzzed with Hypothesis.

Properties, for every reader of outside input (the JSONL readers of episode import, fact import,
batch search, timing --file and memctl import; the configuration file and environment; durations;
the runbook format; the search query syntax):

- never a traceback: in-process, only a MemctlError escapes, with an exit code from 1 to 4; through
  the CLI, the exit code is one of 0-4 and no exception other than SystemExit leaves the command;
- on a refused input nothing is written: the counts of every memory table are unchanged;
- an accepted export, imported and exported again, gives the same records.

The CLI runs in-process (typer's CliRunner) against one real database per test, checked before and
after each example. An exception that escapes a command is re-raised as it is, so Hypothesis tells
distinct defects apart by where they were raised and shrinks each to its own minimal example.
Profiles (derandomized ci here, the long one in tests/bench/fuzz.py): tests/fuzz_profiles.py.
"""

from __future__ import annotations

import datetime
import functools
import io
import json
import math
import sys
import uuid
from collections import Counter
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import assume, event, given, strategies as st
from hypothesis.control import currently_in_test_context
from psycopg import sql

from memctl import config

from memctl.files import jsonl
from memctl.embedding import timing
from memctl.errors import MemctlError
from memctl.reading import search
from memctl.reading.query import Query, split_terms
from memctl.reading.when import period
from memctl.records import episodes, facts, filters
from memctl.write import gate
from memctl.runbooks import runbook_format
from memctl.transfer import import_
from tests.conftest import fresh_database
from tests.fuzz_profiles import share

EXIT_CODES = {0, 1, 2, 3, 4}
ERROR_CODES = {1, 2, 3, 4}
RUNS: Counter = Counter()  # examples run per property (tests/bench/fuzz.py prints it)


def ran() -> None:
    RUNS[sys._getframe(1).f_code.co_name] += 1


TAKEN: Counter = Counter()  # (property, branch): examples that reached the branch


def took(branch: str) -> None:
    """This example reached BRANCH of its property (the branch that asserts on what was accepted)."""
    TAKEN[(sys._getframe(1).f_code.co_name, branch)] += 1


def reaches(branch: str):
    """Above @given: after its examples, the property fails unless one of them reached BRANCH (took), so a
    property whose assertions sit behind an `if` cannot pass idle because every input was refused."""

    def wrap(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            before = TAKEN[(test.__name__, branch)]
            test(*args, **kwargs)
            assert TAKEN[(test.__name__, branch)] > before, (
                f"no example reached {branch!r}: its assertions never ran"
            )

        return run

    return wrap


UTC = datetime.timezone.utc

# --- values -------------------------------------------------------------------------------------------

SPECIAL_TEXT = [
    "",
    " ",
    "\t",
    "\n",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udcff",
    "a\udc80b",
    "'",
    '"',
    '""',
    '"unbalanced',
    'a "b',
    "\\",
    "\\x00",
    "\\u0000",
    "-",
    "--",
    '-"',
    '-"phrase"',
    '-"dry run" deploy',
    "deploy -nginx",
    "& | ! <-> : * ( )",
    "!!",
    "a:*",
    "(a",
    "a)",
    "<->",
    "<2>",
    "'a' & 'b'",
    "\u202e",
    "\r\n",
    "\x1b[31m",
    "\u2028",
    "\U0001d518",
    "NaN",
    "null",
    "true",
    "0",
    "-1",
    "1e309",
    "9" * 40,
    "\u0663",
    "\ufeff",
    "x" * 3000,
    "word " * 400,
]
SYNTAX_CHARS = st.sampled_from(list("\"-&|!<>:*()'\\ \t\n\r\x00\x01\x1b\x7f\u2028\u202e\ufeff"))
CHARS = st.one_of(st.characters(), SYNTAX_CHARS, st.characters(categories=["Cs"]))


def texts(max_size: int = 30) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(CHARS, max_size=max_size))


HUGE_INTS = st.sampled_from(
    [2**31, 2**53 + 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30), 10**400]
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -0.0, 5e-324, 1.5, 5.0])
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), HUGE_INTS, FLOATS, texts())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts(8), inner, max_size=3),
    max_leaves=6,
)


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, each `weight` times as likely (st.one_of draws its distinct branches alike)."""
    branches = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(branches) - 1).flatmap(lambda i: branches[i])


def field(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a valid value of the field, sometimes any JSON value at all (a wrong type, a huge int, ...)."""
    return weighted((2, valid), (1, VALUES))


def record(
    valid: dict[str, st.SearchStrategy], required=(), kind: str | None = None
) -> st.SearchStrategy[dict]:
    """A JSON object with the fields of a record. Half the time every field has a value of its type (so the
    reader gets past the first line and its checks are reached); else required fields are mostly present,
    others present or not, each now and then any JSON value at all, with now and then an unknown field."""
    clean = st.fixed_dictionaries(
        {k: v for k, v in valid.items() if k in required},
        optional={k: v for k, v in valid.items() if k not in required},
    )
    present = st.fixed_dictionaries(
        {k: field(v) for k, v in valid.items() if k in required},
        optional={k: field(v) for k, v in valid.items() if k not in required},
    )
    unknown = weighted(
        (3, st.just({})),
        (
            1,
            st.dictionaries(
                st.sampled_from(["extra", "Content", "id ", "", "type"]) | texts(6),
                VALUES,
                min_size=1,
                max_size=2,
            ),
        ),
    )
    dropped = weighted((3, st.none()), (1, st.sampled_from(sorted(required) or [None])))

    def build(fields, extra, drop):
        item = {**extra, **fields}
        if kind is not None:
            item["type"] = kind
        item.pop(drop, None)
        return item

    return st.one_of(
        st.builds(build, clean, st.just({}), st.none()), st.builds(build, present, unknown, dropped)
    )


def encode(value, ascii_only: bool) -> bytes:
    """One JSONL line; a lone surrogate without ensure_ascii becomes bytes that are not UTF-8."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


JUNK_LINES = st.sampled_from(
    [
        b"",
        b"   ",
        b"\t",
        b"\xef\xbb\xbf{}",
        b"{}\r",
        b"\x00",
        b"{}",
        b"[]",
        b"{",
        b"}",
        b'{"a":1}{"b":2}',
        b'{"content": "\\ud800"}',
        b"\xff\xfe",
        b"NaN",
        b"-Infinity",
    ]
)


def lines(objects: st.SearchStrategy, clean: int = 3) -> st.SearchStrategy[bytes]:
    """A line: the JSON of an object (`clean` times in clean + 1), else bytes, a JSON non-object, truncated
    JSON, or junk."""
    as_json = st.builds(encode, objects, st.booleans())
    junk = st.one_of(
        st.binary(max_size=24),
        st.builds(encode, VALUES, st.booleans()),
        st.builds(lambda b, n: b[:n], as_json, st.integers(0, 30)),
        JUNK_LINES,
    )
    return weighted((clean, as_json), (1, junk))


def streams(line: st.SearchStrategy[bytes], max_lines: int = 5) -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda items, end: b"\n".join(items) + end,
        st.lists(line, max_size=max_lines),
        st.sampled_from([b"", b"\n", b"\r\n"]),
    )


def iso(value: datetime.datetime) -> str:
    return value.isoformat()


ZONES = st.sampled_from(
    [
        None,
        UTC,
        datetime.timezone(datetime.timedelta(hours=14)),
        datetime.timezone(datetime.timedelta(hours=-12, minutes=-30)),
    ]
)
ODD_TIMES = st.sampled_from(
    [
        "0001-01-01T00:00:00+14:00",
        "0001-01-01T00:00:00",
        "9999-12-31T23:59:59-14:00",
        "2026-02-30",
        "2026-08-11T09:30:00Z",
        "2026-08-11",
        "now",
        "1e10",
        "2026-08-11T25:00",
        "+002026-01-01",
        "2026-08-11T09:30:00.123456789Z",
        "2026-W33-2",
        "20260811T093000",
        "",
    ]
)
ORDINARY_TIMES = st.datetimes(
    min_value=datetime.datetime(1970, 1, 1),
    max_value=datetime.datetime(2100, 1, 1),
    timezones=ZONES,
).map(iso)
TIMES = weighted((3, ORDINARY_TIMES), (1, st.datetimes(timezones=ZONES).map(iso)), (1, ODD_TIMES))
CONTENT = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=60),
    st.sampled_from(["deploy failed: disk full", "x" * 5000, "rotate logs on web1"]),
)
KINDS = st.sampled_from(["observation", "conversation", "raw", "summary", "deploy note"])
AGENTS = st.sampled_from(["default", "agent-1", "ops"])
SOURCES = st.sampled_from(["cli", "ticket-bot", "inventory"])
META = st.dictionaries(
    st.text(max_size=5),
    st.one_of(st.integers(-5, 5), st.text(max_size=5), st.booleans(), st.none()),
    max_size=3,
)

EPISODE = {
    "content": CONTENT,
    "kind": KINDS,
    "source": SOURCES,
    "agent": AGENTS,
    "importance": st.integers(0, 10),
    "created_at": TIMES,
    "meta": META,
}
FACT = {
    "key": st.sampled_from(["db.host", "svc.port", "a"]) | st.text(min_size=1, max_size=10),
    "value": st.text(max_size=20),
    "namespace": st.sampled_from(["default", "ops"]),
    "source": SOURCES,
    "version": st.integers(1, 5),
    "updated_at": TIMES,
}

WORDS = st.sampled_from(
    ["deploy", "disk", "full", "nginx", "rotate", "logs", "the", "a", "or", "and", "not", "web1"]
)
OPERATORS = st.sampled_from(
    [
        "&",
        "|",
        "!",
        "<->",
        "<2>",
        ":*",
        "*",
        "(",
        ")",
        "!(",
        ":",
        "'",
        "''",
        "\\",
        "--",
        "-",
        '-"',
        "&&",
        "||",
        "-!",
        "A:B",
        "a&b",
        "x|y",
        "!x",
        "\x00",
        "\x07",
        "\u200b",
    ]
)
PIECES = st.one_of(
    WORDS,
    WORDS.map("-{}".format),
    st.lists(WORDS, max_size=3).map(lambda w: '"' + " ".join(w) + '"'),
    st.lists(WORDS, max_size=3).map(lambda w: '-"' + " ".join(w) + '"'),
    st.lists(WORDS, max_size=3).map(lambda w: '"' + " ".join(w)),
    OPERATORS,
    texts(8),
)
QUERIES = st.one_of(
    texts(),
    st.lists(PIECES, min_size=1, max_size=6).map(" ".join),
    st.lists(PIECES, min_size=1, max_size=6).map("".join),
)
MODES = st.sampled_from(["hybrid", "text", "vector", "bogus", "", "TEXT"])
DURATIONS = st.one_of(
    st.sampled_from(
        [
            "30d",
            "1h",
            "0s",
            "0.5m",
            " 7 d ",
            "7",
            "d",
            "1.5w",
            "2y",
            "1e3d",
            "-1d",
            "99999999999999999999y",
            "9" * 400 + "s",
            "\u0663d",
            "\uff19d",
            "1d\n",
            "1 h",
            "10000000000d",
            "0.0000001s",
        ]
    ),
    st.from_regex(r"\s?\d{1,25}(\.\d{1,5})?\s?[smhdwy]\s?", fullmatch=True),
    texts(12),
)
SEARCH = {
    "query": QUERIES,
    "agent": AGENTS,
    "k": st.integers(1, 20),
    "kind": KINDS,
    "source": SOURCES,
    "since": DURATIONS | TIMES,
    "mode": MODES,
}

# --- in-process parsers ----------------------------------------------------------------------------------


def only_memctl_errors(function, *args, **kwargs):
    """The function's value, or the MemctlError it raised (with an exit code from the documented set);
    any other exception propagates, as a traceback would."""
    try:
        return function(*args, **kwargs)
    except MemctlError as exc:
        assert exc.exit_code in ERROR_CODES, f"{type(exc).__name__} has exit code {exc.exit_code}"
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return exc


def settings_for(tmp_path) -> config.Settings:
    empty = tmp_path / "empty.toml"
    empty.touch()
    return config.load(empty, environ={})


@reaches("read")
@given(
    data=streams(
        lines(record(EPISODE, required=("content",)))
        | texts().map(lambda s: s.encode("utf-8", "surrogatepass"))
    ),
    shape=st.sampled_from(["any", "fields", "required", "both"]),
)
def test_jsonl_reader(data, shape):
    ran()
    options = {
        "any": {},
        "fields": {"fields": episodes.FIELDS},
        "required": {"required": ("content",)},
        "both": {"fields": episodes.FIELDS, "required": ("content",)},
    }[shape]
    result = only_memctl_errors(lambda: list(jsonl.read(io.BytesIO(data), **options)))
    if not isinstance(result, MemctlError):
        took("read")
        for number, item in result:
            assert number >= 1
            if shape != "any":
                assert isinstance(item, dict)


@reaches("skip")
@given(data=streams(lines(record(EPISODE, required=("content",)))), skip=st.booleans())
def test_episode_jsonl(tmp_path, data, skip):
    ran()
    result = episodes.ImportResult()
    parsed = only_memctl_errors(
        lambda: list(
            episodes.parse_jsonl(
                settings_for(tmp_path), io.BytesIO(data), skip_invalid=skip, result=result
            )
        )
    )
    if skip:
        took("skip")
        assert not isinstance(parsed, MemctlError), (
            f"--skip-invalid still refused the input: {parsed}"
        )


@given(data=streams(lines(record(FACT, required=("key", "value")))))
def test_fact_jsonl(data):
    ran()
    only_memctl_errors(facts.parse_import, io.BytesIO(data))


@given(query=record(SEARCH, required=("query",)))
def test_search_query_values(query):
    """What episode search --batch makes of a JSONL line: Query(...).check() refuses, never crashes."""
    ran()
    q = Query(
        query.get("query"),
        k=query.get("k", 5),
        agent=query.get("agent"),
        kind=query.get("kind"),
        source=query.get("source"),
        since=query.get("since"),
        mode=query.get("mode", "hybrid"),
    )
    only_memctl_errors(q.check)


@reaches("read")
@given(
    data=streams(
        lines(st.one_of(record({"content": CONTENT, "text": CONTENT, "query": CONTENT}), VALUES))
        | texts(40).map(lambda s: s.encode("utf-8", "surrogatepass")),
        max_lines=6,
    )
)
def test_timing_file(tmp_path, data):
    ran()
    path = tmp_path / "texts.jsonl"
    path.write_bytes(data)
    found = only_memctl_errors(timing.read_texts, path)
    if not isinstance(found, MemctlError):
        took("read")
        assert found and all(isinstance(t, str) and t.strip() for t in found)


# --- memctl import (export streams) ---

VECTORS = st.fixed_dictionaries(
    {
        "embedder": st.just("hash"),
        "model": st.just("hash-embed"),
        "dims": st.sampled_from([8, 384, 0, -1, 5000]),
    },
    optional={
        "storage": st.sampled_from(["vector", "halfvec", "bogus"]),
        "request_dims": st.none() | st.integers(-1, 9),
    },
)
HEADER = record(
    {
        "format": st.sampled_from([1, 1, 1, 0, 2]),
        "memctl": st.just("0.1.0"),
        "models": st.just([]),
        "vectors": st.none() | VECTORS,
        "exported_at": TIMES,
        "agent": st.none() | AGENTS,
        "since": st.none() | TIMES,
    },
    required=("format",),
    kind="header",
)
HISTORY_ENTRY = record(
    {
        "version": st.integers(1, 4),
        "op": st.sampled_from(["set", "delete", "erase", "bogus"]),
        "old_value": st.none() | st.text(max_size=8),
        "new_value": st.none() | st.text(max_size=8),
        "source": st.none() | SOURCES,
        "changed_at": TIMES,
    }
)
CHUNK = record(
    {
        "seq": st.integers(0, 3),
        "content": CONTENT,
        "embedding": st.lists(st.floats(-1, 1), min_size=1, max_size=8),
    }
)
EXPORT_RECORDS = st.one_of(
    record(
        {
            "source": SOURCES | st.text(max_size=5),
            "reason": st.none() | st.text(max_size=8),
            "blocked_at": TIMES,
        },
        required=("source",),
        kind="blocked_source",
    ),
    record(
        {
            "namespace": st.sampled_from(["default", "ops"]),
            "key": FACT["key"],
            "value": st.none() | FACT["value"],
            "source": st.none() | SOURCES,
            "version": st.integers(1, 4),
            "updated_at": TIMES,
            "history": st.lists(HISTORY_ENTRY, max_size=3),
        },
        required=("namespace", "key", "history"),
        kind="fact",
    ),
    record(
        {
            "id": st.integers(1, 4),
            "agent": AGENTS,
            "kind": KINDS,
            "source": SOURCES,
            "importance": st.integers(0, 10),
            "created_at": TIMES,
            "meta": META,
            "content": CONTENT,
            "chunks": st.none() | st.lists(CHUNK, max_size=2),
            "record_key": st.none()
            | st.sampled_from(["ab" * 16, "0123456789ABCDEF" * 2])
            | st.text(max_size=33)
            | st.integers(),
        },
        required=("id", "agent", "content", "created_at"),
        kind="episode",
    ),
    record(
        {
            "agent": AGENTS,
            "summary_id": st.integers(1, 4),
            "source_id": st.integers(-3, 4),
            "source_created_at": TIMES,
            "source_hash": st.binary(max_size=32).map(bytes.hex),
        },
        required=("agent", "summary_id", "source_id", "source_created_at", "source_hash"),
        kind="summary_source",
    ),
    record(
        {
            "agent": AGENTS,
            "name": st.sampled_from(["deploy", "rotate-logs"]),
            "commit": st.just("0" * 40),
            "dirty": st.booleans(),
            "started_at": TIMES,
            "finished_at": st.none() | TIMES,
            "outcome": st.sampled_from(["ok", "failed", "interrupted"]),
            "steps": st.integers(0, 5),
            "from_step": st.none() | st.integers(1, 5),
            "failed_step": st.none() | st.integers(1, 5),
            "exit_code": st.none() | st.integers(0, 255),
            "duration_s": st.none() | st.floats(0, 100),
            "output_tail": st.none() | st.text(max_size=20),
            "episode_id": st.none() | st.integers(1, 4),
        },
        required=("agent", "name", "commit", "started_at", "outcome", "steps"),
        kind="runbook_run",
    ),
)
WHOLE_EXPORTS = st.builds(
    lambda head, body, end: b"\n".join([head, *body]) + end,
    lines(HEADER, clean=8),
    st.lists(lines(EXPORT_RECORDS, clean=8), max_size=4),
    st.sampled_from([b"", b"\n"]),
)
EXPORTS = weighted((3, WHOLE_EXPORTS), (1, streams(lines(EXPORT_RECORDS))))


@given(data=EXPORTS)
def test_export_records(data):
    ran()
    only_memctl_errors(lambda: list(import_.records(io.BytesIO(data))))


# --- configuration, durations -----------------------------------------------------------------------------


def toml_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(
        value, ensure_ascii=False
    )  # a basic string (a lone surrogate: bytes that are not UTF-8)


def _key(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def toml_document(top: dict, tables: dict) -> bytes:
    out = [f"{_key(k)} = {toml_literal(v)}" for k, v in top.items()]
    for name, table in tables.items():
        out.append(f"[{name}]")
        out.extend(f"{_key(k)} = {toml_literal(v)}" for k, v in table.items())
    return "\n".join(out).encode("utf-8", "surrogatepass")


CHOICES = sorted(
    {
        "ollama",
        "local",
        "hash",
        "vector",
        "halfvec",
        "created",
        "accessed",
        "weighted",
        "rrf",
        "redact",
        "block",
        "off",
        "conversation",
        "nomic-embed-text",
        "postgresql://u:secret@127.0.0.1/db",
    }
)
TABLES = sorted({*(s for s in config.SCHEMA if s), *config.FREE_SECTIONS, "bogus"})
KEYS = sorted(
    {
        *(k for keys in config.SCHEMA.values() for k in keys),
        *config.RETENTION_SPECIAL,
        "conversation",
        "raw",
        "default",
        "bogus",
    }
)
TOML_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 100),
    HUGE_INTS.filter(lambda n: abs(n) < 2**64),
    FLOATS,
    DURATIONS,
    st.sampled_from(CHOICES),
    texts(12),
    st.datetimes(),
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=2)
    ),
    max_leaves=4,
)
DOCUMENTS = st.builds(
    toml_document,
    st.dictionaries(
        st.sampled_from(["database_url", "runbooks", "bogus"]), TOML_VALUES, max_size=2
    ),
    st.dictionaries(
        st.sampled_from(TABLES),
        st.dictionaries(st.sampled_from(KEYS), TOML_VALUES, max_size=3),
        max_size=3,
    ),
)
CONFIG_FILES = st.one_of(
    DOCUMENTS,
    DOCUMENTS,
    DOCUMENTS,
    st.binary(max_size=40),
    st.builds(
        lambda d, n, junk: d[:n] + junk + d[n:],
        DOCUMENTS,
        st.integers(0, 40),
        st.sampled_from([b"\xff", b"\x00", b"\xef\xbb\xbf", b"\r", b"[", b"\xc3"]),
    ),
)
DURATION_VALUES = st.one_of(
    st.from_regex(r"\d{1,25}(\.\d{1,5})?[smhdwy]", fullmatch=True),
    st.sampled_from(["9" * 400 + "s", "0s", "00.0d", "0.0001s", "1e3d", "30d"]),
)


def mostly(valid: st.SearchStrategy, edge: st.SearchStrategy) -> st.SearchStrategy:
    return weighted((3, valid), (1, edge))


# Values of a setting's type, mostly ordinary, else the edges a check may let through (0, nan, inf, huge).
TYPED = {
    "_duration": mostly(st.from_regex(r"[1-9]\d{0,3}[smhdwy]", fullmatch=True), DURATION_VALUES),
    "_positive_int": mostly(st.integers(1, 5000), st.sampled_from([0, -1, 1001, 2**31, 2**63])),
    "_non_negative_int": mostly(st.integers(0, 5000), st.sampled_from([-1, 2**31, 2**63])),
    "_importance": mostly(st.integers(0, 10), st.sampled_from([-1, 11])),
    "_positive_number": mostly(
        st.floats(0.001, 1000), st.sampled_from([math.nan, math.inf, 0.0, 1e308, 5e-324])
    ),
    "_number": mostly(st.floats(-10, 10), st.sampled_from([math.nan, math.inf, -math.inf, 1e308])),
    "_fraction": mostly(st.floats(0, 1), st.sampled_from([math.nan, -0.0, 1.0000001])),
    "_string": texts(12),
    "_bool": st.booleans(),
    "_kinds": st.lists(st.sampled_from(["raw", "conversation", "", " "]), max_size=2),
}
TYPED["_job_log_age"] = TYPED["_duration"]


def typed(check) -> st.SearchStrategy:
    """Values of the type a setting's check takes (in range or just out of it), else any TOML value."""
    options = [
        c.cell_contents
        for c in (getattr(check, "__closure__", None) or ())
        if isinstance(c.cell_contents, tuple)
    ]
    if options:
        return mostly(st.sampled_from(list(options[0])), texts(8))
    return TYPED.get(getattr(check, "__name__", ""), TOML_SCALARS)


@st.composite
def typed_documents(draw) -> bytes:
    """A file of known keys with values of about the right type: most are accepted, so what they hold is tested."""
    tables: dict = {}
    for name in draw(
        st.lists(st.sampled_from(sorted(s for s in config.SCHEMA if s)), max_size=4, unique=True)
    ):
        keys = draw(
            st.lists(
                st.sampled_from(sorted(config.SCHEMA[name])), min_size=1, max_size=4, unique=True
            )
        )
        tables[name] = {key: draw(typed(config.SCHEMA[name][key].check)) for key in keys}
    if draw(st.booleans()):
        tables["retention"] = {
            kind: draw(TYPED["_duration"])
            for kind in draw(
                st.lists(st.sampled_from(["raw", "conversation", "jobs"]), max_size=2, unique=True)
            )
        }
    if draw(st.booleans()):
        tables["importance"] = {
            kind: draw(st.integers(-1, 11))
            for kind in draw(
                st.lists(
                    st.sampled_from(["raw", "conversation", "default"]), max_size=2, unique=True
                )
            )
        }
    return toml_document({}, tables)


TYPED_DOCUMENTS = typed_documents()
ENV_TEXT = st.text(
    st.one_of(
        st.characters(exclude_characters="\x00"),
        st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
    ),
    max_size=20,
)  # what an environment can hold: no NUL; undecodable bytes as surrogate escapes
ENVS = st.dictionaries(
    st.sampled_from(sorted(config.ENV_OVERRIDES.values())),
    st.one_of(ENV_TEXT, st.sampled_from(CHOICES), st.just("")),
    max_size=3,
)


def _numbers(settings: config.Settings):
    for section, key, value in settings.items():
        if isinstance(value, float):
            yield f"{section}.{key}", value


def _durations(settings: config.Settings):
    for section, key, value in settings.items():
        check = config.SCHEMA[section][key].check if section in config.SCHEMA else None
        if (getattr(check, "__name__", "") == "_duration" and value is not None) or (
            section == "retention" and isinstance(value, str)
        ):
            yield f"{section}.{key}", value


@reaches("loaded")
@given(document=CONFIG_FILES, env=ENVS)
def test_config_file_and_environment(tmp_path, document, env):
    ran()
    path = tmp_path / "config.toml"
    path.write_bytes(document)
    loaded = only_memctl_errors(config.load, path, environ=env)
    if isinstance(loaded, config.Settings):
        took("loaded")
        assert config.shown_settings(loaded)
    only_memctl_errors(config.read_section, path, "retention")


@given(document=TYPED_DOCUMENTS)
@share(0.5)
def test_config_accepted_values_are_usable(tmp_path, document):
    """A setting the file may hold is one memctl can use: finite numbers, durations that fit a timedelta."""
    ran()
    path = tmp_path / "config.toml"
    path.write_bytes(document)
    loaded = only_memctl_errors(config.load, path, environ={})
    assume(isinstance(loaded, config.Settings))
    for name, value in _numbers(loaded):
        assert math.isfinite(value), f"{name} = {value!r} accepted from {document!r}"
    for name, value in _durations(loaded):
        seconds = config.parse_duration(value)
        assert math.isfinite(seconds), (
            f"{name} = {value!r} accepted from {document!r}: {seconds} seconds"
        )
        datetime.timedelta(seconds=seconds)  # retention and --since subtract it from now


@reaches("parsed")
@given(text=DURATIONS)
def test_durations(text):
    ran()
    try:
        seconds = config.parse_duration(text)
    except ValueError:
        pass  # its documented refusal: every caller turns it into a setting's or an option's error
    except MemctlError as exc:
        assert exc.exit_code in ERROR_CODES
    else:
        took("parsed")
        assert isinstance(seconds, float) and math.isfinite(seconds) and seconds >= 0, (
            text,
            seconds,
        )
    since = only_memctl_errors(filters.parse_since, text)
    if not isinstance(since, MemctlError):
        assert since.tzinfo is not None


@reaches("parsed")
@given(value=TIMES | VALUES)
def test_times(value):
    ran()
    parsed = only_memctl_errors(gate.parse_time, value)
    if not isinstance(parsed, MemctlError):
        took("parsed")
        assert parsed.tzinfo is not None
        parsed.astimezone(UTC)


# --- runbooks ---------------------------------------------------------------------------------------------

FENCES = st.sampled_from(
    ["```sh", "```bash", "~~~sh", "````sh", "```", "```sh {.x}", "  ```sh", "```SH", "```console"]
)
CLOSERS = st.sampled_from(["```", "~~~", "````", "", "``", "``` x"])
LINE_TEXT = texts(20).map(lambda s: s.replace("\n", " ").replace("\r", " "))


@st.composite
def runbook_texts(draw) -> str:
    out = [
        draw(
            st.sampled_from(["# Deploy", "#", "# ", "Deploy", "## Deploy", "# T #", "#\tTab"])
            | LINE_TEXT.map("# {}".format)
        )
    ]
    out += draw(st.lists(LINE_TEXT, max_size=2))
    heading = draw(
        st.sampled_from(
            ["## {n}. {t}", "## Step {n}: {t}", "{n}. {t}", "{n}) {t}", "### {n} {t}", "## {t}"]
        )
    )
    for expected in range(1, draw(st.integers(0, 4)) + 1):
        number = draw(
            st.one_of(st.just(expected), st.just(expected), st.integers(0, 5), HUGE_INTS.map(abs))
        )
        out.append(heading.format(n=number, t=draw(LINE_TEXT)))
        out += draw(st.lists(LINE_TEXT, max_size=1))
        for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2]))):
            out.append(draw(FENCES))
            out += draw(st.lists(LINE_TEXT, max_size=2))
            out.append(draw(st.one_of(st.just("```"), CLOSERS)))
    out += draw(st.lists(LINE_TEXT, max_size=2))
    return draw(st.sampled_from(["\n", "\r\n", "\r"])).join(out)


@reaches("parsed")
@given(text=runbook_texts() | texts(200), name=st.one_of(st.just("deploy"), texts(20)))
def test_runbook_format(text, name):
    ran()
    parsed = only_memctl_errors(runbook_format.parse, text, name)
    if not isinstance(parsed, MemctlError):
        took("parsed")
        assert [s.number for s in parsed.steps] == list(range(1, len(parsed.steps) + 1))
        assert all(s.command.strip() for s in parsed.steps)
    only_memctl_errors(runbook_format.check_name, name)


SAFE_LINE = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789 ._-$/|"), min_size=1, max_size=20
).filter(lambda s: s.strip() and s[0].isalnum())


@given(
    title=SAFE_LINE,
    steps=st.lists(
        st.tuples(SAFE_LINE, st.lists(SAFE_LINE, min_size=1, max_size=3)), min_size=1, max_size=4
    ),
    numbered_list=st.booleans(),
)
def test_runbook_format_reads_a_well_formed_runbook(title, steps, numbered_list):
    """The checks above must not pass by refusing everything: a well-formed runbook reads back exactly."""
    ran()
    out = [f"# {title}", "", "What it does.", ""]
    for number, (step_title, commands) in enumerate(steps, 1):
        out += [
            f"{number}. {step_title}" if numbered_list else f"## {number}. {step_title}",
            "",
            "```sh",
            *commands,
            "```",
            "",
        ]
    parsed = runbook_format.parse("\n".join(out), "deploy")
    assert parsed.title == title.strip()
    assert [(s.title, s.command) for s in parsed.steps] == [
        (t.strip(" \t-:\u2013\u2014"), "\n".join(c).strip("\n") + "\n") for t, c in steps
    ]


# --- the search query syntax ---


@given(text=QUERIES)
def test_split_terms(text):
    ran()
    terms = split_terms(text)
    for piece in terms.wanted + terms.excluded:
        assert isinstance(piece, str) and piece.strip() and piece in text


DATE_PIECES = st.sampled_from(
    [
        "May",
        "may",
        "Feb.",
        "sept",
        "December",
        "of",
        "in",
        "during",
        "on",
        ",",
        "-",
        "0",
        "1",
        "29",
        "31",
        "32",
        "3rd",
        "2022",
        "2024",
        "1899",
        "2099",
        "2022-02-29",
        "2024-02-29",
        "2022-00-01",
        "2022-12",
        "2022-13",
        "9999-99-99",
    ]
)


# Dates written as people write them, most of them real: the branch that checks a period found must be reached.
DATES = st.builds(
    "{} {} {}, {}".format,
    st.sampled_from(["in", "on", "during", "what happened", ""]),
    st.sampled_from(["May", "sept", "Feb.", "December"]),
    st.integers(0, 32).map(str) | st.just("3rd"),
    st.sampled_from(["2022", "2024", "1899", "2099"]),
)


@reaches("found")
@given(text=QUERIES | st.lists(DATE_PIECES, max_size=8).map(" ".join) | DATES)
def test_the_period_a_query_names_is_a_real_span_or_none(text):
    ran()
    found = period(text)
    if found is not None:
        took("found")
        assert found.start < found.end and found.start.tzinfo is not None
        assert (
            found.closeness(found.start) == 1.0
            and found.closeness(found.start - datetime.timedelta(1)) == 0.0
        )


def test_split_terms_reads_the_documented_syntax():
    terms = split_terms('deploy -nginx "disk full" -"dry run" api-v2 - or "unbalanced')
    assert terms.wanted == ["deploy", "disk full", "api-v2", "-", "or", "unbalanced"]
    assert terms.excluded == ["nginx", "dry run"]


# --- the CLI against a real database ----------------------------------------------------------------------

LOCATIONS = ("MEMCTL_DATABASE_URL", "MEMCTL_READ_DATABASE_URL", "OLLAMA_HOST")
NOWHERE = (
    "http://127.0.0.1:9"  # loopback, nothing listening: a fuzzed host never reaches the network
)
COUNTED = (
    "episodes",
    "chunks",
    "embed_queue",
    "facts",
    "fact_history",
    "blocked_sources",
    "summary_sources",
    "runbook_runs",
    "embedding_models",
)
COUNTS = sql.SQL("SELECT {}").format(
    sql.SQL(", ").join(
        sql.SQL("(SELECT count(*) FROM {}) AS {}").format(sql.Identifier(t), sql.Identifier(t))
        for t in COUNTED
    )
)


@pytest.fixture
def counts(db_url):
    """counts() -> the row count of every memory table, on one connection for the whole test."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield lambda: dict(zip(COUNTED, conn.execute(COUNTS).fetchone()))


def invoke(*args: str, input: bytes | str | None = None, env: dict | None = None):
    """memctl in-process -> click Result, checked: exit code 0-4, no traceback, no escaped exception."""
    from memctl.cli import app
    from tests.conftest import memctl_runner

    result = memctl_runner().invoke(app, list(args), input=input, env=env, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # what the user would see as a traceback, with where it was raised
    assert result.exit_code in EXIT_CODES, (args, result.exit_code, result.stderr)
    for stream in (result.stdout, result.stderr):
        assert "Traceback (most recent call last)" not in stream, (args, stream)
    if currently_in_test_context():  # the statistics say how far the examples got
        event(f"{args[0]} {args[1] if len(args) > 1 else ''}: exit {result.exit_code}")
    return result


@pytest.fixture
def run(memctl_env):
    """invoke() against this test's database (memctl_env)."""
    return invoke


def refused_wrote_nothing(result, before: dict, after: dict, data) -> None:
    if result.exit_code != 0:
        changed = {t: (before[t], after[t]) for t in COUNTED if before[t] != after[t]}
        assert not changed, (
            f"exit {result.exit_code} ({result.stderr.strip()!r}) but wrote {changed}; input {data!r}"
        )


@given(data=streams(lines(record(EPISODE, required=("content",))), max_lines=4), skip=st.booleans())
@share(0.2)
def test_cli_episode_import(run, counts, data, skip):
    ran()
    before = counts()
    result = run("episode", "import", "-", *(["--skip-invalid"] if skip else []), input=data)
    refused_wrote_nothing(result, before, counts(), data)


@given(data=streams(lines(record(FACT, required=("key", "value"))), max_lines=4))
@share(0.15)
def test_cli_fact_import(run, counts, data):
    ran()
    before = counts()
    result = run("fact", "import", "-", input=data)
    refused_wrote_nothing(result, before, counts(), data)


@given(data=EXPORTS)
@share(0.25)
def test_cli_memctl_import(run, counts, data):
    ran()
    before = counts()
    result = run("import", "-", input=data)
    refused_wrote_nothing(result, before, counts(), data)


SEED = [
    "deploy failed on web1: disk full",
    "rotated nginx logs after the deploy",
    "dry run of the deploy went fine",
    "the disk on db2 is full again",
]


def seed(env: dict | None = None) -> None:
    data = "".join(
        json.dumps({"content": c, "kind": "conversation" if i % 2 else "observation"}) + "\n"
        for i, c in enumerate(SEED)
    )
    assert invoke("episode", "import", "-", input=data, env=env).exit_code == 0
    assert invoke("embed", env=env).exit_code == 0


@pytest.fixture
def seeded(run, db_url):
    """The test database with a few episodes, embedded by the hash embedder, and a connection and settings."""
    from memctl import db

    seed()
    with db.connect(db_url, settings=config.load()) as conn:
        yield conn, conn.settings


@dataclass
class Shared:
    """One seeded database for the edge cases, each a single run: made once for the module."""

    env: dict
    conn: object

    def run(self, *args: str, input: bytes | str | None = None):
        return invoke(*args, input=input, env=self.env)

    def counts(self) -> dict:
        return dict(zip(COUNTED, self.conn.execute(COUNTS).fetchone().values()))


@pytest.fixture(scope="module")
def shared(pg_server, tmp_path_factory):
    from memctl import db

    config_file = tmp_path_factory.mktemp("fuzz") / "config.toml"
    config_file.touch()
    with fresh_database(pg_server, "memctl_f") as url:
        env = {
            "MEMCTL_DATABASE_URL": url,
            "MEMCTL_CONFIG": str(config_file),
            "MEMCTL_EMBEDDER": "hash",
            "MEMCTL_EMBED_MODEL": "hash-embed",
            "OLLAMA_HOST": NOWHERE,
        }
        seed(env)
        with db.connect(url) as conn:
            yield Shared(env, conn)


def test_search_finds_the_seeded_episodes(seeded):
    """The search properties below run against episodes a plain query does find (by words and by meaning)."""
    conn, _ = seeded
    for mode in ("text", "hybrid", "vector"):
        outcome = search.search(conn, Query("disk full", mode=mode))
        assert outcome.hits and outcome.mode == mode, mode


@given(document=TYPED_DOCUMENTS, mode=MODES)
@share(0.5)
def test_search_with_accepted_settings(seeded, tmp_path, document, mode):
    """Settings the file may hold run a search (half-lives, weights, windows, fusion, candidates)."""
    ran()
    conn, _ = seeded
    path = tmp_path / "search.toml"
    path.write_bytes(document)
    loaded = only_memctl_errors(
        config.load,
        path,
        environ={
            "MEMCTL_EMBEDDER": "hash",
            "OLLAMA_HOST": NOWHERE,
            "MEMCTL_EMBED_MODEL": "hash-embed",
        },
    )
    assume(isinstance(loaded, config.Settings))
    only_memctl_errors(search.search, conn.use_settings(loaded), Query("disk full", mode=mode))


# Edges the properties reach only now and then, run on every run (each refused, or run without a crash).
SETTING_EDGES = [
    '[search]\nrecency_half_life = "0s"\n',
    '[search]\ncontext_window = "0s"\n',
    "[search]\nef_search = 1001\n",
    "[search]\ncandidates = 9223372036854775808\n",
    "[search]\nrecency_weight = nan\n",
    "[search]\nbm25_k1 = inf\n",
    "[embedding]\ntimeout = nan\n",
    "[embedding]\nsearch_timeout = inf\n",
    "[recall]\nmin_score = nan\n",
]


@pytest.mark.parametrize("document", SETTING_EDGES)
def test_setting_edges_refused_or_usable(shared, tmp_path, document):
    conn = shared.conn
    path = tmp_path / "edge.toml"
    path.write_text(document)
    loaded = only_memctl_errors(
        config.load,
        path,
        environ={
            "MEMCTL_EMBEDDER": "hash",
            "OLLAMA_HOST": NOWHERE,
            "MEMCTL_EMBED_MODEL": "hash-embed",
        },
    )
    if isinstance(loaded, MemctlError):
        return  # refused, with a message and an exit code
    for name, value in _numbers(loaded):
        assert math.isfinite(value), f"{name} = {value!r} accepted"
    for mode in ("text", "hybrid", "vector"):
        only_memctl_errors(search.search, conn.use_settings(loaded), Query("disk full", mode=mode))


@reaches("searched")
@given(text=QUERIES, mode=MODES)
@share(0.5)
def test_search_query_syntax(seeded, text, mode):
    ran()
    conn, _ = seeded
    outcome = only_memctl_errors(search.search, conn, Query(text, mode=mode))
    if not isinstance(outcome, MemctlError):
        took("searched")
        assert all(isinstance(h.id, int) for h in outcome.hits)


@given(
    text=QUERIES,
    mode=MODES,
    k=st.one_of(st.integers(-2, 1001), HUGE_INTS).map(str) | st.just("x"),
    since=st.none() | DURATIONS,
)
@share(0.15)
def test_cli_episode_search(seeded, run, counts, text, mode, k, since):
    ran()
    assume(not text.startswith("-"))  # an option to click, not a query
    before = counts()
    args = [
        "episode",
        "search",
        text,
        "-k",
        k,
        "--mode",
        mode,
        "-f",
        "json",
        *(["--since", since] if since else []),
    ]
    run(*args)
    assert counts() == before


@given(data=streams(lines(record(SEARCH, required=("query",))), max_lines=4))
@share(0.15)
def test_cli_episode_search_batch(seeded, run, counts, data):
    ran()
    before = counts()
    run("episode", "search", "--batch", "-", input=data)
    assert counts() == before


@given(
    data=streams(
        lines(st.one_of(record({"content": CONTENT, "text": CONTENT, "query": CONTENT}), VALUES))
        | texts(40).map(lambda s: s.encode("utf-8", "surrogatepass")),
        max_lines=5,
    )
)
@share(0.1)
def test_cli_timing_file(run, counts, tmp_path, data):
    ran()
    path = tmp_path / "texts.jsonl"
    path.write_bytes(data)
    before = counts()
    run("embed", "timing", "--file", str(path), "--sample", "3", "--batch-size", "2", "-f", "json")
    assert counts() == before


@given(since=DURATIONS)
@share(0.1)
def test_cli_since_option(run, since):
    ran()
    assume(not since.startswith("-") and "\x00" not in since)
    run("episode", "list", "--since", since, "-f", "json")


@given(
    document=st.booleans().flatmap(lambda typed: TYPED_DOCUMENTS if typed else CONFIG_FILES),
    env=ENVS,
)
@share(0.12)
def test_cli_config(run, counts, memctl_env, document, env):
    """The configuration reaches every command: config show, a search and an import refuse it, or run."""
    ran()
    with open(memctl_env["MEMCTL_CONFIG"], "wb") as handle:
        handle.write(document)
    # Only loopback: the environment (which wins over the file) names the test database as the replica
    # and an Ollama address where nothing listens, whatever hosts the fuzzed file names.
    env = {
        **{k: v for k, v in env.items() if k not in LOCATIONS},
        "MEMCTL_READ_DATABASE_URL": memctl_env["MEMCTL_DATABASE_URL"],
        "OLLAMA_HOST": NOWHERE,
    }
    run("config", "show", "-f", "json", env=env)
    run("episode", "search", "deploy went fine", "-f", "json", env=env)
    before = counts()
    result = run(
        "episode", "import", "-", input=json.dumps({"content": "deploy went fine"}) + "\n", env=env
    )
    refused_wrote_nothing(result, before, counts(), document)


HEADER_LINE = b'{"type": "header", "format": 1}\n'
INPUT_EDGES = [
    ("episode", "import", b'{"content": "\\ud800"}'),
    ("episode", "import", b'{"content": "a", "agent": "\\udcff"}'),
    ("episode", "import", b'{"content": "a", "meta": {"x": NaN}}'),
    ("episode", "import", b'{"content": "a", "meta": {"\\ud800": 1}}'),
    ("episode", "import", b'{"content": "a", "created_at": "0001-01-01T00:00:00+14:00"}'),
    ("episode", "import", b'{"content": "a", "importance": 1e400}'),
    ("fact", "import", b'{"key": "k", "value": "\\ud800"}'),
    ("fact", "import", b'{"key": "\\udcff", "value": "v"}'),
    ("fact", "import", b'{"key": "k", "value": "v", "namespace": ""}'),
    ("search", "--batch", b'{"query": "disk", "k": "5"}'),
    ("search", "--batch", b'{"query": "disk", "k": 1.5}'),
    ("search", "--batch", b'{"query": "disk", "k": 1e400}'),
    ("search", "--batch", b'{"query": "disk", "k": null}'),
    ("search", "--batch", b'{"query": "disk", "k": true}'),
    ("search", "--batch", b'{"query": "\\ud800"}'),
    ("search", "--batch", b'{"query": "disk", "agent": {}}'),
    ("search", "--batch", b'{"query": "disk", "kind": 5}'),
    ("search", "--batch", b'{"query": "disk", "since": "99999999999d"}'),
    ("search", "--batch", b'{"query": "disk", "mode": ["text"]}'),
    ("import", "-", HEADER_LINE[:-2] + b', "vectors": {}}'),
    ("import", "-", HEADER_LINE[:-2] + b', "vectors": "yes"}'),
    ("import", "-", HEADER_LINE[:-2] + b', "vectors": {"embedder": "hash"}}'),
    (
        "import",
        "-",
        HEADER_LINE[:-2] + b', "vectors": {"embedder": "hash", "model": "m", "dims": -1}}',
    ),
    ("import", "-", HEADER_LINE[:-2] + b', "format": 1e400}'),
    ("import", "-", HEADER_LINE + b'{"type": "blocked_source", "source": "s", "reason": {}}'),
    (
        "import",
        "-",
        HEADER_LINE + b'{"type": "episode", "id": 1, "agent": "a", "content": "\\ud800", '
        b'"created_at": "2026-08-11T09:30:00Z"}',
    ),
    (
        "import",
        "-",
        HEADER_LINE + b'{"type": "episode", "id": 1, "agent": "a", "content": "c", '
        b'"created_at": "2026-08-11T09:30:00Z", "chunks": [{"seq": "x", "content": "c"}]}',
    ),
    (
        "import",
        "-",
        HEADER_LINE + b'{"type": "fact", "namespace": "n", "key": "k", "history": [{"version": 1, '
        b'"op": "set", "new_value": "v", "changed_at": "2026-08-11"}, 5]}',
    ),
    (
        "import",
        "-",
        HEADER_LINE + b'{"type": "runbook_run", "agent": "a", "name": "n", "commit": "c", '
        b'"started_at": "2026-08-11T09:30:00Z", "outcome": "ok", "steps": 1, '
        b'"output_tail": 5}',
    ),
    (
        "import",
        "-",
        HEADER_LINE + b'{"type": "runbook_run", "agent": "a", "name": "n", "commit": "c", '
        b'"started_at": "2026-08-11T09:30:00Z", "outcome": "ok", "steps": 1e400}',
    ),
    (
        "import",
        "-",
        HEADER_LINE + b'{"type": "summary_source", "agent": "a", "summary_id": 1, "source_id": 2, '
        b'"source_created_at": "2026-08-11", "source_hash": 5}',
    ),
    ("timing", "--file", b'{"content": "\\ud800"}'),
    ("timing", "--file", b"\xff\xfe"),
]
COMMANDS = {
    "episode": ["episode", "import", "-"],
    "fact": ["fact", "import", "-"],
    "search": ["episode", "search", "--batch", "-"],
    "import": ["import", "-"],
}


@pytest.mark.parametrize(
    "command,option,data",
    INPUT_EDGES,
    ids=lambda v: v.decode("utf-8", "replace")[:60] if isinstance(v, bytes) else None,
)
def test_input_edges(shared, tmp_path, command, option, data):
    """Inputs the properties reach only now and then, run on every run: refused or run, never a crash."""
    before = shared.counts()
    if command == "timing":
        path = tmp_path / "edge.jsonl"
        path.write_bytes(data)
        result = shared.run("embed", "timing", "--file", str(path), "--sample", "2", "-f", "json")
    else:
        result = shared.run(*COMMANDS[command], input=data)
    refused_wrote_nothing(result, before, shared.counts(), data)
    if command in ("timing", "search"):
        assert shared.counts() == before


ARGUMENT_EDGES = [  # undecodable bytes on a command line reach Python as surrogate escapes
    ("episode", "search", "disk \udcff"),
    ("episode", "search", "\x00"),
    ("episode", "search", '-"unbalanced'),
    ("episode", "add", "\udcff"),
    ("fact", "set", "k", "\udcff"),
    ("fact", "set", "\udcff", "v"),
    ("episode", "list", "--since", "\udcff"),
    ("episode", "list", "--agent", "\udcff"),
]


@pytest.mark.parametrize(
    "args", ARGUMENT_EDGES, ids=lambda a: " ".join(a).encode("ascii", "backslashreplace").decode()
)
def test_argument_edges(shared, args):
    before = shared.counts()
    refused_wrote_nothing(shared.run(*args), before, shared.counts(), args)


# --- round trip: an accepted export, imported and exported again, gives the same records ---

SAFE_TEXT = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789 .,:;-_/\n'\"éßж日ü"),
    min_size=1,
    max_size=80,
).filter(str.strip)
SAFE_META = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=4),
    st.one_of(
        st.integers(-1000, 1000),
        SAFE_TEXT,
        st.booleans(),
        st.none(),
        st.sampled_from([0.5, -2.25, 1e-3]),
        st.lists(st.integers(0, 9), max_size=3),
    ),
    max_size=3,
)
ROUND_EPISODES = st.lists(
    st.tuples(
        SAFE_TEXT,
        st.sampled_from(["observation", "conversation", "raw"]),
        st.none() | SOURCES,
        st.integers(1, 10),
        st.datetimes(
            min_value=datetime.datetime(1990, 1, 1),  # no later than now:
            max_value=datetime.datetime(2025, 12, 31),  # [limits] clock_skew
            timezones=ZONES.filter(bool),
        ),
        SAFE_META,
        st.booleans(),
    ),
    max_size=5,
)
ROUND_FACTS = st.lists(
    st.tuples(
        st.integers(0, 50),
        st.lists(st.none() | SAFE_TEXT, min_size=1, max_size=4),
        st.none() | SOURCES,
    ),
    max_size=4,
    unique_by=lambda f: f[0],
)


def _fact_record(
    namespace: str, key: str, values: list, source, start: datetime.datetime
) -> dict | None:
    history, current = [], None
    for value in values:
        if value is None and current is None:
            continue
        op = "set" if value is not None else "delete"
        history.append(
            {
                "version": len(history) + 1,
                "op": op,
                "old_value": current,
                "new_value": value,
                "source": source if op == "set" else None,
                "changed_at": (start + datetime.timedelta(seconds=len(history) + 1)).isoformat(),
            }
        )
        current = value
    if not history:
        return None
    live = current is not None
    return {
        "type": "fact",
        "namespace": namespace,
        "key": key,
        "value": current,
        "source": source if live else None,
        "version": len(history) if live else None,
        "updated_at": history[-1]["changed_at"] if live else None,
        "history": history,
    }


def _time(text: str | None):
    return (
        None
        if text is None
        else datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    )


def comparable(text: str, tag: str) -> dict:
    """This example's records (its agents and namespace), ids and times' spelling left out."""
    found: dict = {"episode": [], "fact": []}
    for line in text.splitlines():
        item = json.loads(line)
        if item["type"] == "episode" and item["agent"].startswith(tag):
            # repeat_of null (a first) and record_key null (no key) are what a file without the field imports
            # as: every content here is unique
            found["episode"].append(
                {
                    **{
                        k: v
                        for k, v in item.items()
                        if k not in ("id", "chunks")
                        and not (k in ("repeat_of", "record_key") and v is None)
                    },
                    "created_at": _time(item["created_at"]),
                }
            )
        elif item["type"] == "fact" and item["namespace"] == tag:
            found["fact"].append(
                {
                    **item,
                    "updated_at": _time(item["updated_at"]),
                    "history": [
                        {**h, "changed_at": _time(h["changed_at"])} for h in item["history"]
                    ],
                }
            )
    key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
    return {kind: sorted(items, key=key) for kind, items in found.items()}


@pytest.fixture
def second_db(pg_server):
    with fresh_database(pg_server, "memctl_f") as url:
        yield url


@given(episode_specs=ROUND_EPISODES, fact_specs=ROUND_FACTS)
@share(0.08)
def test_round_trip(run, memctl_env, db_url, second_db, episode_specs, fact_specs):
    ran()
    with open(memctl_env["MEMCTL_CONFIG"], "w") as handle:
        handle.write(
            '[redaction]\nmode = "off"\n'
        )  # the round trip, not the redaction, is under test here
    tag = f"rt{uuid.uuid4().hex[:10]}"
    start = datetime.datetime(2026, 8, 1, tzinfo=UTC)
    out = [{"type": "header", "format": 1}]
    for number, (key, values, source) in enumerate(fact_specs):
        fact = _fact_record(
            tag, f"svc{key}.host", values, source, start + datetime.timedelta(hours=number)
        )
        if fact is not None:
            out.append(fact)
    for number, (content, kind, source, importance, when, meta, second) in enumerate(
        episode_specs, 1
    ):
        out.append(
            {
                "type": "episode",
                "id": number,
                "agent": f"{tag}-{'b' if second else 'a'}",
                "kind": kind,
                "source": source,
                "importance": importance,
                "created_at": when.isoformat(),
                "meta": meta,
                "content": f"{content} #{number}",
            }
        )
    given_export = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out)
    expected = comparable(given_export, tag)
    assert len(expected["episode"]) == len(episode_specs) and len(expected["fact"]) == len(
        out
    ) - 1 - len(episode_specs)  # the comparison sees every record of this example
    imported = run("import", "-", input=given_export.encode())
    assert imported.exit_code == 0, (imported.stderr, given_export)
    first = run("export")
    assert first.exit_code == 0, first.stderr
    assert comparable(first.stdout, tag) == expected
    again = run("import", "-", input=first.stdout.encode(), env={"MEMCTL_DATABASE_URL": second_db})
    assert again.exit_code == 0, again.stderr
    second = run("export", env={"MEMCTL_DATABASE_URL": second_db})
    assert second.exit_code == 0, second.stderr
    assert comparable(second.stdout, tag) == comparable(first.stdout, tag)
