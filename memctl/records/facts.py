"""Facts: keyed, editable, with an append-only history in two timelines (docs/facts.md).

Every change to one key runs under a transaction-scoped lock on that
key, so concurrent `set`s serialise: each gets its own version and history row.

Each version keeps when memctl recorded it (changed_at: system time) and when it
became true (valid_from: valid time, default the time it is recorded; never later).
The value valid at T is the version with the greatest valid_from <= T (ties: the
later recorded), counting only versions after the key's last erasure; a delete is a
version that ends the value. The current value, kept in `facts`, is the version with
the greatest valid_from: a back-dated correction is history, not the current value.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, overload

from memctl.files import jsonl
from memctl.errors import BadValue, InvalidInput, NotFound
from memctl.write import values
from memctl.write.values import WRITER

if TYPE_CHECKING:
    from memctl import redact
    from memctl.db.memory import Memory
    from memctl.write import admission, gate

# Reading a fact (get, list, history) imports neither the gate nor redaction: `memctl fact get` starts
# about 25 ms sooner (tests/bench/startup.py). Writes import them where they write.
DEFAULT_NAMESPACE = values.DEFAULT_NAMESPACE
MAX_KEY = values.MAX_KEY


@dataclass
class Fact:
    namespace: str
    key: str
    value: str
    source: str | None
    version: int
    updated_at: datetime.datetime  # when memctl recorded this version (system time)
    valid_from: datetime.datetime  # when it became true (valid time)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Change:
    namespace: str
    key: str
    op: str
    old_value: str | None  # the current value before this change
    new_value: str | None
    version: int
    source: str | None = None
    valid_from: datetime.datetime | None = None
    current: bool = True  # False: a back-dated version, a later-valid one stays the current value

    @property
    def current_value(self) -> str | None:
        """The value `fact get` answers after this change: the new one, or for a back-dated version the one
        that stays (None: the key stays deleted)."""
        return self.new_value if self.current else self.old_value

    def to_dict(self) -> dict:
        return {**asdict(self), "current_value": self.current_value}


# Where erased values can still be, after each kind of vacuum: said in the result, not only in the docs.
LEFT_AFTER_VACUUM = (
    "the table files' free space (VACUUM makes the old row versions' space reusable without "
    "promising to overwrite it), WAL, WAL archives, backups, dumps and replicas, until those are "
    "overwritten, age out or are rebuilt"
)
LEFT_AFTER_FULL = (
    "the file system's free blocks (VACUUM FULL deletes the old table files, it does not overwrite "
    "them), WAL, WAL archives, backups, dumps and replicas, until those age out or are rebuilt"
)
LEFT_UNVACUUMED = (
    "the table files as dead row versions (not vacuumed: the connection is in a transaction), WAL, "
    "WAL archives, backups, dumps and replicas"
)


@dataclass
class Erasure:
    """What an erasure did. The values are gone from every row; `still_in` says where their bytes may remain."""

    namespace: str
    key: str
    fact_removed: bool
    history_values_erased: int
    version: int
    vacuum: str | None = None  # "VACUUM", "VACUUM FULL", or None (not run)
    checkpoint: bool = False
    still_in: str = LEFT_UNVACUUMED
    ledger: str | None = None  # the erasure ledger's entry (memctl.records.erasures)
    quotes_erased: dict | None = None  # job log and runbook run rows that quoted a value, rewritten

    def to_dict(self) -> dict:
        return asdict(self)


LOCK_KEY = "SELECT memctl_lock_key(%s, %s || chr(31) || %s)"  # memctl.db.locks: no agent's session may hold it
LOCK_CLASS = 0x6D666B79  # "mfky": one lock per (namespace, key)
CURRENT = "SELECT value, version FROM facts WHERE namespace = %s AND key = %s"
LAST_VERSION = (
    "SELECT coalesce(max(version), 0) AS v FROM fact_history WHERE namespace = %s AND key = %s"
)


def lock_key(conn: Memory, namespace: str, key: str) -> None:
    """Writers of one fact's key take turns until their transaction ends."""
    conn.execute(LOCK_KEY, (LOCK_CLASS, namespace, key))


def _lock(conn: Memory, namespace: str, key: str) -> tuple[str | None, int]:
    """Lock the key for this transaction; return (current value, last version ever used)."""
    lock_key(conn, namespace, key)
    row = conn.execute(CURRENT, (namespace, key)).fetchone()
    last = conn.one(LAST_VERSION, (namespace, key))["v"]
    return (row["value"] if row else None), max(last, row["version"] if row else 0)


# Per key, the version valid at %(at)s (NULL: the greatest valid_from, i.e. the current one), a delete included.
VERSIONS_AT = """
SELECT DISTINCT ON (h.namespace, h.key) h.namespace, h.key, h.op, h.new_value AS value, h.source, h.version,
       h.changed_at AS updated_at, h.valid_from
FROM fact_history h
WHERE h.op IN ('set', 'delete') AND (%(at)s::timestamptz IS NULL OR h.valid_from <= %(at)s)
  AND (%(namespaces)s::text[] IS NULL OR h.namespace = ANY(%(namespaces)s))
  AND (%(key)s::text IS NULL OR h.key = %(key)s)
  AND (%(prefix)s::text IS NULL OR starts_with(h.key, %(prefix)s))
  AND NOT EXISTS (SELECT 1 FROM fact_history e WHERE e.namespace = h.namespace AND e.key = h.key
                  AND e.op = 'erase' AND e.version > h.version)
ORDER BY h.namespace, h.key, h.valid_from DESC, h.changed_at DESC, h.version DESC
"""
# The facts valid at %(at)s, as rows of `facts` (memctl.recall.recall reads them too).
VALID_AT = (
    "SELECT namespace, key, value, source, version, updated_at, valid_from FROM ("
    + VERSIONS_AT
    + ") AS versions WHERE op = 'set'"
)
NOW = "SELECT now() AS now"


def at_params(
    at: datetime.datetime | None = None,
    *,
    namespace: str | None = None,
    key: str | None = None,
    prefix: str | None = None,
) -> dict:
    return {
        "at": at,
        "namespaces": None if namespace is None else [namespace],
        "key": key,
        "prefix": prefix,
    }


@overload
def moment(
    value: str | datetime.datetime, what: str, skew: float | None = ...
) -> datetime.datetime: ...
@overload
def moment(
    value: str | datetime.datetime | None, what: str, skew: float | None = ...
) -> datetime.datetime | None: ...
def moment(
    value: str | datetime.datetime | None, what: str, skew: float | None = None
) -> datetime.datetime | None:
    """A point in time: now, a duration back from now (3d, 12h) or an ISO 8601 date/time (no zone: UTC), no later
    than [limits] clock_skew (`skew`) from now (memctl.records.filters.moment)."""
    if value is None or isinstance(value, datetime.datetime):
        return None if value is None else values.parse_time(value, what)
    from memctl.records.filters import parse_since

    return parse_since(value, what, skew)


def check_valid_from(
    value: str | datetime.datetime | None,
    what: str = "valid_from",
    *,
    now: datetime.datetime | None = None,
) -> datetime.datetime | None:
    """`value` as a time, refused (BadValue) when it lies after `now` (default: this machine's clock): stricter than
    the clock skew every other time is allowed (moment), and said so."""
    when = moment(value, what, skew=float("inf"))
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if when is not None and when > now:
        raise BadValue(
            f"{what} {when.isoformat()}: is in the future (it is {now.isoformat(timespec='seconds')}); "
            "memctl keeps what is or was true, not scheduled values: set it when it becomes true",
            what,
        )
    return when


def _set_in_tx(conn: Memory, fact: admission.FactValue, admit: gate.Gate) -> Change:
    from memctl.write import store

    old, last = _lock(conn, fact.namespace, fact.key)
    if (
        fact.valid_from is not None
    ):  # the database's clock records the version: no later than its now()
        check_valid_from(fact.valid_from, now=conn.one(NOW)["now"])
    version = last + 1
    recorded = store.insert_history(
        conn,
        admit.history(
            fact, version, "set", old, fact.value, fact.source, valid_from=fact.valid_from
        ),
    )
    winner = conn.one(VERSIONS_AT, at_params(namespace=fact.namespace, key=fact.key), prepare=False)
    current = winner["version"] == version
    if current:
        store.put_fact(conn, fact, version, recorded["changed_at"])
    return Change(
        fact.namespace,
        fact.key,
        "set",
        old,
        fact.value,
        version,
        fact.source,
        recorded["valid_from"],
        current,
    )


def validate(key: str, value: str, namespace: str, source: str | None) -> None:
    """The gate's checks of a fact's fields (BadValue naming the field), without redaction."""
    values.check_key(key)
    values.check_value(value)
    values.name(namespace, "namespace")
    values.name(source, "source", optional=True)


def set_fact(
    conn: Memory,
    key: str,
    value: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    source: str | None = None,
    redactor: redact.Redactor | None = None,
    settings=None,
    valid_from: str | datetime.datetime | None = None,
) -> Change:
    """Set a fact through the gate: a secret in the value is redacted first, or refused (`redactor`, default:
    [redaction] mode), and a blocked source is refused. `valid_from`: when the value became true (a duration
    back or an ISO time; default now; never in the future); a back-dated value older than the current one's
    is recorded without becoming the current value (Change.current False)."""
    admit = _gate(conn, redactor, settings)
    fact = admit.fact(namespace, key, value, source, check_valid_from(valid_from))
    with admit.writing():
        return _set_in_tx(conn, fact, admit)


def _gate(
    conn: Memory, redactor: redact.Redactor | None, settings, *, bulk: bool = False
) -> gate.Gate:
    from memctl import config, redact
    from memctl.write import gate

    settings = settings if settings is not None else config.load()
    return gate.Gate(
        conn,
        settings,
        redactor if redactor is not None else redact.Redactor.from_settings(settings),
        bulk=bulk,
    )


GET = """
SELECT namespace, key, value, source, version, updated_at, valid_from FROM facts WHERE namespace = %s AND key = %s
"""


def get_fact(
    conn: Memory,
    key: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    as_of: str | datetime.datetime | None = None,
) -> Fact:
    """The current value, or with `as_of` the value valid at that time (NotFound: none then)."""
    if as_of is not None:
        at = moment(as_of, "as_of")
        row = conn.execute(
            VALID_AT, at_params(at, namespace=namespace, key=key), prepare=False
        ).fetchone()
        if row is None:
            raise NotFound(
                f"no value of fact {key!r} in namespace {namespace!r} as of {at.isoformat()}"
            )
        return Fact(**row)
    row = conn.execute(GET, (namespace, key)).fetchone()
    if row is None:
        raise NotFound(f"no fact {key!r} in namespace {namespace!r}")
    return Fact(**row)


LIST = """
SELECT namespace, key, value, source, version, updated_at, valid_from FROM facts
WHERE (%(namespace)s::text IS NULL OR namespace = %(namespace)s)
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s))
ORDER BY namespace, key
"""


def list_facts(
    conn: Memory,
    *,
    namespace: str | None = DEFAULT_NAMESPACE,
    prefix: str | None = None,
    as_of: str | datetime.datetime | None = None,
) -> Iterator[Fact]:
    """The current facts, or with `as_of` those valid at that time, sorted by namespace and key."""
    if as_of is not None:
        rows = conn.execute(
            VALID_AT,
            at_params(moment(as_of, "as_of"), namespace=namespace, prefix=prefix),
            prepare=False,
        )
    else:
        rows = conn.execute(LIST, {"namespace": namespace, "prefix": prefix}, prepare=False)
    for row in rows:
        yield Fact(**row)


HISTORY_OF = """
SELECT namespace, key, version, op, old_value, new_value, source, valid_from, changed_at
FROM fact_history WHERE namespace = %s AND key = %s ORDER BY version, id
"""


def history(conn: Memory, key: str, *, namespace: str = DEFAULT_NAMESPACE) -> list[dict]:
    rows = conn.execute(HISTORY_OF, (namespace, key)).fetchall()
    if not rows:
        raise NotFound(f"no history for fact {key!r} in namespace {namespace!r}")
    return rows


DELETE = "DELETE FROM facts WHERE namespace = %s AND key = %s"


def delete_fact(
    conn: Memory,
    key: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    source: str | None = None,
    settings=None,
) -> Change:
    from memctl.write import store

    admit = _gate(conn, None, settings)
    fact = admit.fact(namespace, key, None, source)
    with admit.writing():
        old, last = _lock(conn, namespace, key)
        if old is None:
            raise NotFound(f"no fact {key!r} in namespace {namespace!r}")
        conn.execute(DELETE, (namespace, key))
        store.insert_history(conn, admit.history(fact, last + 1, "delete", old, None, source))
    return Change(namespace, key, "delete", old, None, last + 1, source)


ERASE_VALUES = (
    WRITER
    + """
UPDATE fact_history SET old_value = NULL, new_value = NULL
WHERE namespace = %s AND key = %s AND (old_value IS NOT NULL OR new_value IS NOT NULL)
"""
)


ERASED_TABLES = ("facts", "fact_history")
CHECKPOINT = "CHECKPOINT"


VALUES_HELD = """
SELECT value AS v FROM facts WHERE namespace = %(ns)s AND key = %(key)s
UNION SELECT old_value FROM fact_history WHERE namespace = %(ns)s AND key = %(key)s AND old_value IS NOT NULL
UNION SELECT new_value FROM fact_history WHERE namespace = %(ns)s AND key = %(key)s AND new_value IS NOT NULL
"""


def erase_fact(
    conn: Memory,
    key: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    full: bool = False,
    record: bool = True,
) -> Erasure:
    """Remove the fact and every value its history held, keeping a record that an erasure happened.

    The old row versions stay in the table files as dead tuples. On an
    autocommit connection, VACUUM then makes their space reusable (without
    promising to overwrite it; versions an open transaction still sees stay);
    with `full`, VACUUM FULL rewrites both tables into new files (an exclusive
    lock on them while it runs) and a CHECKPOINT lets the WAL that holds the old
    values be recycled (skipped without the privilege: superuser or
    pg_checkpoint). Neither reaches WAL archives, backups or replicas.

    With `record` (the default) the erasure goes into the erasure ledger (memctl.records.erasures: the
    key, and keyed digests of every value erased), and job log rows that quoted a value are rewritten.
    """
    from memctl import redact
    from memctl.records import erasures
    from memctl.write import gate, store

    secret = erasures.load_key() if record else b""
    admit = gate.Gate(
        conn, None, redact.Redactor("off")
    )  # an erasure record holds no value to check
    fact = admit.fact(namespace, key, None, None)
    with admit.writing():
        old, last = _lock(conn, namespace, key)
        if old is None and last == 0:
            raise NotFound(f"no fact {key!r} in namespace {namespace!r}")
        held = [r["v"] for r in conn.execute(VALUES_HELD, {"ns": namespace, "key": key}).fetchall()]
        removed = conn.execute(DELETE, (namespace, key)).rowcount > 0
        erased = conn.execute(ERASE_VALUES, (namespace, key)).rowcount
        store.insert_history(conn, admit.history(fact, last + 1, "erase", None, None, None))
    result = Erasure(namespace, key, removed, erased, last + 1)
    if record:
        quotes: list[str] = []
        with conn.transaction():
            result.quotes_erased = erasures.scrub_quotes(conn, held, secret, quotes)
        entry = erasures.new_entry(
            conn,
            "fact_erase",
            key=secret,
            target=f"{namespace}/{key}",
            counts={"facts": int(removed), "fact_history_values": erased, **result.quotes_erased},
            items={
                "facts": [
                    {
                        "namespace": namespace,
                        "key": key,
                        "digests": sorted({erasures.digest(secret, v) for v in held}),
                        "erased": True,
                    }
                ],
                "quotes": quotes,
            },
        )
        result.ledger = erasures.record(conn, entry).id
    if not conn.autocommit:
        return result
    vacuum(conn, full=full)
    result.vacuum, result.still_in = (
        ("VACUUM FULL", LEFT_AFTER_FULL) if full else ("VACUUM", LEFT_AFTER_VACUUM)
    )
    if full:
        result.checkpoint = _checkpoint(conn)
    return result


def vacuum(conn: Memory, *, full: bool) -> None:
    """VACUUM the tables an erasure rewrites (FULL: rewrite them, so no erased value stays on disk)."""
    from psycopg import sql

    command = sql.SQL("VACUUM (FULL, ANALYZE) {}") if full else sql.SQL("VACUUM {}")
    for table in ERASED_TABLES:
        conn.execute(command.format(sql.Identifier(table)))


def _checkpoint(conn: Memory) -> bool:
    import psycopg

    try:
        conn.execute(CHECKPOINT)
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def export_rows(conn: Memory, *, namespace: str | None = None) -> Iterator[dict]:
    for fact in list_facts(conn, namespace=namespace):
        yield {
            "namespace": fact.namespace,
            "key": fact.key,
            "value": fact.value,
            "source": fact.source,
            "valid_from": fact.valid_from,
        }


IMPORT_FIELDS = ("key", "value", "namespace", "source", "version", "updated_at", "valid_from")


def parse_import(lines: Iterable[bytes]) -> list[dict]:
    """Parse JSONL fact records (memctl.files.jsonl); any bad line fails the whole import, naming the line."""
    records = []
    for number, item in jsonl.read(lines, fields=IMPORT_FIELDS):
        try:
            records.append(_record(item))
        except (InvalidInput, BadValue) as exc:
            raise jsonl.at(number, exc) from None
    return records


def _record(item: dict) -> dict:
    record: dict[str, Any] = {
        "key": item.get("key"),
        "value": item.get("value"),
        "namespace": item.get("namespace") or DEFAULT_NAMESPACE,
        "source": item.get("source"),
        "valid_from": item.get("valid_from"),
    }
    for field in ("key", "value"):
        if not isinstance(record[field], str):
            raise BadValue(f"{field}: must be a string", field)
    for field in ("namespace", "source"):
        if record[field] is not None and not isinstance(record[field], str):
            raise BadValue(f"{field}: must be a string", field)
    validate(record["key"], record["value"], record["namespace"], record["source"])
    if record["valid_from"] is not None:
        if not isinstance(record["valid_from"], str):
            raise BadValue("valid_from: must be an ISO 8601 string", "valid_from")
        record["valid_from"] = check_valid_from(
            values.parse_time(record["valid_from"], "valid_from")
        )
    return record


def import_facts(
    conn: Memory,
    records: list[dict],
    *,
    source: str | None = None,
    redactor: redact.Redactor | None = None,
    settings=None,
) -> list[Change]:
    """Set every record in one transaction through the gate: all of them or none."""
    admit = _gate(conn, redactor, settings, bulk=True)
    admitted = [
        admit.fact(r["namespace"], r["key"], r["value"], r["source"] or source, r.get("valid_from"))
        for r in records
    ]
    with admit.writing():
        return [_set_in_tx(conn, fact, admit) for fact in admitted]
