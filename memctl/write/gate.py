"""The one gate: every record that enters memory passes here.

A record is admitted by a `Gate` (validated, its source checked against the blocked sources, every text field
redacted or refused per [redaction] mode) and only an admitted record, the very object a gate made
(memctl.write.admission), can be written, by the writers of memctl.write.store. They hold every statement
that inserts into or copies into a memory table (places.MEMORY_TABLES): tests/test_gate.py reads the library's
source and fails if such a statement appears anywhere else, so a new write path cannot go around the gate unnoticed.

What the gate checks, for every path (`episode add` and `import`, `fact set` and
`import`, `memctl import`, summaries, runbook run records, the MCP server):

- episodes: content a non-empty string without NUL; kind, agent, source non-empty strings without NUL; importance
  an integer 0-10 (0: not stored, by the write policy); created_at ISO 8601; meta a JSON object. Content, meta
  values, kind, source and agent are redacted. Chunks are always made here from the admitted content: a chunk text
  given by an import is never stored, and its vector is kept only when the text is exactly the chunk made here.
- facts and their history: namespace, key, value and source checked and redacted; a value
  under a key that names a secret (`db.password`) is a secret whatever it looks like.
- runbook runs (agent, name, commit, output; outcome ok/failed/null), summary lineage, blocked sources (the
  name too: a writer's source is matched as given and as stored): types checked, texts redacted.
- sizes: [limits] episode_bytes (content), meta_bytes, value_bytes (fact and history values, reasons, commits),
  and an episode's created_at no earlier than 1900 nor later than [limits] clock_skew from now
  (memctl.write.values.Limits), exit 2 naming the setting.
- every source (of an episode, a fact, a history entry) checked against blocked_sources, and again
  as the write commits (Gate.writing): a source blocked while an import ran refuses the whole import.

Bad values raise errors.BadValue naming the field (exit 2), empty or NUL text included; refused content
(a secret in block mode) raises InvalidInput (exit 1); a blocked source raises Blocked (exit 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, overload

from memctl.db import locks
from memctl.errors import BadValue, Blocked
from memctl.write import chunking, repeats, values
from memctl.write.admission import (
    BlockedSource,
    Episode,
    FactValue,
    HistoryEntry,
    Lineage,
    RunRecord,
    WindowLineage,
    admitted,
    is_admitted,
    seal as _sealed,
)
from memctl.write.values import check_key, check_value, integer, name, parse_time
from memctl.write.values import no_nul as _no_nul, shown as _shown

if TYPE_CHECKING:
    from memctl import redact
    from memctl.db.memory import Memory

DEFAULT_AGENT = "default"
DEFAULT_KIND = "observation"
DEFAULT_NAMESPACE = values.DEFAULT_NAMESPACE
FALLBACK_IMPORTANCE = 5


# --- episodes -----------------------------------------------------------------


@dataclass
class NewEpisode:
    """A validated episode (not yet redacted or checked against blocked sources)."""

    content: str
    kind: str
    agent: str
    source: str | None
    importance: int
    created_at: datetime.datetime | None
    meta: dict[str, Any] = field(default_factory=dict)
    line: int | None = field(
        default=None, compare=False
    )  # where it was read (an import), for errors

    @functools.cached_property
    def content_hash(self) -> bytes:
        return hashlib.sha256(self.content.encode("utf-8")).digest()


def importance_for(settings, kind: str) -> int:
    policy = settings.importance
    return policy.get(kind, policy.get("default", FALLBACK_IMPORTANCE))


def validate(
    settings,
    content: Any,
    *,
    kind: Any = None,
    source: Any = None,
    agent: Any = None,
    importance: Any = None,
    created_at: Any = None,
    meta: Any = None,
    limits: values.Limits | None = None,
) -> NewEpisode:
    """An episode's fields checked: types, NUL, names, importance, the [limits] (content and meta bytes, a
    created_at between 1900 and clock_skew from now). `limits`: the settings' (given by a caller that checks many)."""
    if not isinstance(content, str):
        raise BadValue(f"content: must be a string, got {_shown(content)}", "content")
    limits = limits or values.Limits.of(settings)
    values.within(content, limits.episode_bytes, "content", "episode_bytes")
    if not content.strip():
        raise BadValue("the episode text is empty", "content")
    _no_nul(content, "episode text")
    kind = name(kind, "kind", default=DEFAULT_KIND)
    agent = name(agent, "agent", default=DEFAULT_AGENT)
    source = name(source, "source", optional=True)
    importance = (
        importance_for(settings, kind)
        if importance is None
        else integer(importance, "importance", 0, 10)
    )
    when = None if created_at is None else values.in_time(parse_time(created_at), limits)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise BadValue(f"meta: must be a JSON object, got {_shown(meta)}", "meta")
    if not meta:  # most episodes: nothing to encode (an import skips two json.dumps a row)
        return NewEpisode(content, kind, agent, source, importance, when, meta)
    try:
        encoded = json.dumps(meta, allow_nan=False)
        stored = json.dumps(meta, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise BadValue(f"meta: not storable as JSON ({type(exc).__name__})", "meta") from None
    if len(stored) > limits.meta_bytes:
        raise BadValue(
            values.too_long("meta", len(stored), limits.meta_bytes, "meta_bytes"), "meta"
        )
    if "\\u0000" in encoded:
        raise BadValue(
            "meta: contains a NUL character, which PostgreSQL jsonb cannot store", "meta"
        )
    return NewEpisode(content, kind, agent, source, importance, when, meta)


FACT_OPS = ("set", "delete", "erase")
RUN_OUTCOMES = ("ok", "failed", None)


# --- the gate -------------------------------------------------------------------


class Gate:
    """Admits records for one write (or one import): the redactor counts what it replaced.

    A write admits its records, then writes them inside `writing()`: its transaction, which looks at the
    blocked sources again before it commits (memctl.db.locks): a source blocked meanwhile refuses it whole.

    `bulk`: the blocked sources are read once, when the gate opens (an import checks thousands of
    records). A source an import's own file blocks is blocked from then on, for later writes; the
    file's records from it were accepted where they were written and are restored as they were.
    """

    def __init__(
        self, conn: Memory, settings, redactor: redact.Redactor | None = None, *, bulk: bool = False
    ):
        self.conn, self.settings = conn, settings
        from memctl import (
            redact,
        )  # imported by writes only: reading checks values with the gate, never redacts

        self.redactor = (
            redactor if redactor is not None else redact.Redactor.from_settings(settings)
        )
        self._blocked: dict[str, str | None] | None = None
        self.sources: set[str] = (
            set()
        )  # the sources this gate allowed (SOURCES_KEPT): looked at by confirm()
        self.blocking: set[str] = (
            set()
        )  # sources this write blocks itself (an import's file): not refused
        self._before: dict[str, str | None] | None = (
            None  # what was blocked when self.sources filled up
        )
        self._fold_key: bytes | None = None  # read when redaction first changes an episode
        if bulk:  # read now: an import's copying thread holds the connection while the next batch is admitted
            self._blocked = self._all_blocked()
            self._fold_key = repeats.fold_key(conn)

    @functools.cached_property
    def limits(self) -> values.Limits:
        """[limits] of the settings (a gate given none: the configuration's, as the CLI would load it)."""
        if self.settings is None:
            from memctl import config

            return values.Limits.of(config.load())
        return values.Limits.of(self.settings)

    @functools.cached_property
    def chunk_size(self) -> int:
        return chunking.chunk_size_for(
            self.settings.embedding.model, self.settings.chunking.max_chars
        )

    @functools.cached_property
    def overlap(self) -> int:
        return self.settings.chunking.overlap

    # sources

    def allow(self, source: str | None) -> None:
        """Refuse a blocked source (Blocked, exit 1, with the reason), by its name as given or as the gate stores
        it (stored_name: redacted), so a source blocked under a name holding a password is refused either way."""
        if source is None:
            return
        names = source_forms(source)
        if (
            self._blocked is not None
        ):  # refused here, a source is not one the write holds: confirm() skips it
            for form in (f for f in names if f in self._blocked):
                refuse(names[-1], self._blocked[form])
        elif (row := self.conn.execute(CHECK_BLOCKED_ANY, (list(names),)).fetchone()) is not None:
            refuse(names[-1], row["reason"])
        for form in names:
            if form not in self.sources:
                if len(self.sources) < SOURCES_KEPT:
                    self.sources.add(form)
                elif (
                    self._before is None
                ):  # memory stays flat: confirm() then refuses on any block made since
                    self._before = (
                        self._blocked if self._blocked is not None else self._all_blocked()
                    )

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """The write's transaction, committed once confirm() finds none of its sources blocked (writing_on)."""
        with self.conn.transaction(), self.conn.gate_open(self):
            yield
            self.confirm()

    def covers(self, source: str | None) -> bool:
        """Whether confirm() looks at `source` again: one this gate allowed (all of them past SOURCES_KEPT)."""
        return source is None or source in self.sources or self._before is not None

    def confirm(self) -> None:
        """At the end of the write's transaction: the blocked sources' shared lock (held to the commit), then
        every source allowed looked at again. A block that committed while the write ran is refused here.

        A write of more than SOURCES_KEPT distinct sources is refused by any source blocked since it passed
        that many (other than its own), whether or not it holds a record from it: refused whole, safely."""
        sources = self.sources - self.blocking
        if not sources and self._before is None:
            return
        self.conn.execute(locks.SOURCES_LOCK)
        if self._before is not None:
            since = {
                s: r
                for s, r in self._all_blocked().items()
                if s not in self._before and s not in self.blocking
            }
            if since:
                raise Blocked(
                    f"source {min(since)!r} was blocked while this write of more than {SOURCES_KEPT:,} "
                    "distinct sources ran, which keeps no list that long to tell whether it holds a record "
                    "from it: nothing of the write was kept; run it again"
                )
        row = (
            self.conn.execute(CHECK_BLOCKED_ANY, (sorted(sources),)).fetchone() if sources else None
        )
        if row is not None:
            refuse(row["source"], row["reason"], late=True)

    def _all_blocked(self) -> dict[str, str | None]:
        return {r["source"]: r["reason"] for r in self.conn.execute(BLOCKED).fetchall()}

    @overload
    def _text(self, value: str, what: str) -> str: ...
    @overload
    def _text(self, value: str | None, what: str) -> str | None: ...
    def _text(self, value: str | None, what: str) -> str | None:
        return self.redactor.text(value, what)

    def _source(self, source: str | None, what: str) -> str | None:
        """An allowed source as stored: redacted (allow() looked at this form too: it is what is kept)."""
        return self._text(source, what)

    # episodes

    def stored_episode(self, agent: str, content: str, meta: dict) -> Episode:
        """An episode already in memory whose text is being rewritten (redact scan --fix): redacted, rechunked."""
        episode = self.episode(NewEpisode(content, DEFAULT_KIND, agent, None, 1, None, meta or {}))
        assert episode is not None  # importance 1: kept
        return _sealed(
            dataclasses.replace(episode, agent=agent)
        )  # the row keeps its agent: its key

    def episode(self, episode: NewEpisode) -> Episode | None:
        """Admit a validated episode; None when the write policy drops it (importance 0)."""
        if episode.importance == 0:
            return None
        self.allow(episode.source)
        content = self._text(episode.content, "episode text")
        meta = self.redactor.value(episode.meta, "episode meta") if episode.meta else {}
        kind, agent = (
            self._text(episode.kind, "episode kind"),
            self._text(episode.agent, "episode agent"),
        )
        source = self._source(episode.source, "episode source")
        changed = (content, kind, agent, source, meta) != (
            episode.content,
            episode.kind,
            episode.agent,
            episode.source,
            episode.meta,
        )
        digest = (
            episode.content_hash
            if content == episode.content
            else hashlib.sha256(content.encode("utf-8")).digest()
        )
        secret = None
        if changed:  # what keeps two secrets redacted alike from folding (memctl.write.repeats.secret_digest)
            self._fold_key = self._fold_key or repeats.fold_key(self.conn)
            secret = repeats.secret_digest(
                self._fold_key,
                {
                    "content": episode.content,
                    "meta": episode.meta,
                    "kind": episode.kind,
                    "source": episode.source,
                },
            )
        return _sealed(
            Episode(
                content,
                kind,
                agent,
                source,
                episode.importance,
                episode.created_at,
                meta,
                tuple(chunking.chunk_text(content, self.chunk_size, self.overlap)),
                digest,
                changed,
                secret,
            )
        )

    def new_episode(self, content: Any, **fields: Any) -> Episode | None:
        return self.episode(validate(self.settings, content, **fields))

    # facts

    def fact(
        self, namespace: Any, key: Any, value: Any, source: Any, valid_from: Any = None
    ) -> FactValue:
        """A fact's value (None: deleted); a key that names a secret makes its value one. `valid_from`: when the
        value became true (ISO 8601; None: when it is recorded)."""
        when = None if valid_from is None else parse_time(valid_from, "valid_from")
        namespace = name(namespace, "namespace", default=DEFAULT_NAMESPACE)
        key = check_key(key)
        source = name(source, "source", optional=True)
        if value is not None:
            value = check_value(value, limit=self.limits.value_bytes)
        self.allow(source)
        # One rule on every path: a value is judged by its key as stored (redacted), the key `redact scan` reads
        # and an export carries, so the gate, the scan and an import of the export all store the same value.
        clean_key = self._text(key, "fact key")
        return _sealed(
            FactValue(
                self._text(namespace, "fact namespace"),
                clean_key,
                self.redactor.named(clean_key, value, f"value of fact {clean_key!r}")
                if value is not None
                else None,
                self._source(source, "fact source"),
                when,
            )
        )

    @staticmethod
    def fact_of(entry: HistoryEntry) -> FactValue:
        """The value an admitted `set` history entry makes current (an import's merge), as it was admitted."""
        if not is_admitted(entry, HistoryEntry) or entry.op != "set" or entry.new_value is None:
            raise TypeError("only an admitted set entry with its value makes a fact's value")
        return _sealed(
            FactValue(entry.namespace, entry.key, entry.new_value, entry.source, entry.valid_from)
        )

    def history(
        self,
        fact: FactValue,
        version: Any,
        op: Any,
        old_value: Any,
        new_value: Any,
        source: Any,
        changed_at: Any = None,
        valid_from: Any = None,
    ) -> HistoryEntry:
        version = integer(version, "history version", 1, 2**62)
        if op not in FACT_OPS:
            raise BadValue(
                f"history op: must be one of {', '.join(FACT_OPS)}, got {_shown(op)}", "op"
            )
        source = name(source, "history source", optional=True)
        self.allow(source)
        values = []
        for what, value in (("old_value", old_value), ("new_value", new_value)):
            if value is not None:
                check_value(value, f"history {what}", self.limits.value_bytes)
                value = self.redactor.named(fact.key, value, f"history of fact {fact.key!r}")
            values.append(value)
        when = None if changed_at is None else parse_time(changed_at, "changed_at")
        valid = None if valid_from is None else parse_time(valid_from, "valid_from")
        if valid is not None and when is not None and valid > when:
            raise BadValue(
                f"valid_from {valid.isoformat()} is after changed_at {when.isoformat()}: a value cannot "
                "become true after memctl recorded it",
                "valid_from",
            )
        return _sealed(
            HistoryEntry(
                fact.namespace,
                fact.key,
                version,
                op,
                values[0],
                values[1],
                self._source(source, "fact source"),
                when,
                valid,
            )
        )

    # runbook runs, lineage, blocked sources

    def run_record(self, row: dict) -> RunRecord:
        """A runbook run's record: every text (agent, name, commit, outcome, output) redacted as any field is."""
        clean = dict(row)
        clean["agent"] = self._text(
            name(row.get("agent"), "agent", default=DEFAULT_AGENT), "run agent"
        )
        clean["name"] = self._text(name(row.get("name"), "name"), "run name")
        if clean.get("commit") is not None:
            clean["commit"] = self._text(
                check_value(clean["commit"], "commit", self.limits.value_bytes), "run commit"
            )
        if (
            clean.get("outcome") not in RUN_OUTCOMES
        ):  # a word of a list: no text that could hold a secret
            raise BadValue(
                "outcome: must be ok, failed or null (the value is not shown: it is not one)",
                "outcome",
            )
        for column in ("steps", "from_step", "failed_step", "exit_code"):
            if clean.get(column) is not None:
                clean[column] = integer(clean[column], column, -(2**31), 2**31 - 1)
        if clean.get("duration_s") is not None and (
            isinstance(clean["duration_s"], bool)
            or not isinstance(clean["duration_s"], (int, float))
        ):
            raise BadValue(
                f"duration_s: must be a number, got {_shown(clean['duration_s'])}", "duration_s"
            )
        for column in ("started_at", "finished_at"):
            if clean.get(column) is not None:
                clean[column] = parse_time(clean[column], column)
        if clean.get("output_tail") is not None:
            clean["output_tail"] = self.run_output(clean["output_tail"])
        return _sealed(RunRecord(clean))

    def run_output(self, tail: Any) -> str:
        """A run's output as stored: at most [limits] episode_bytes, connection passwords masked (a log never
        holds one, whatever the mode), then redacted or refused (block mode) as any text."""
        from memctl.config import mask_secrets

        text = check_value(tail, "output_tail", self.limits.episode_bytes, "episode_bytes")
        return self._text(mask_secrets(text), "run output")

    def lineage(
        self, agent: Any, summary_id: Any, source_id: Any, source_created_at: Any, source_hash: Any
    ) -> Lineage:
        agent = name(agent, "agent")
        ids = [
            integer(v, what, -(2**63), 2**63 - 1)
            for v, what in ((summary_id, "summary_id"), (source_id, "source_id"))
        ]
        if isinstance(source_hash, str):
            try:
                source_hash = bytes.fromhex(source_hash)
            except ValueError:
                raise BadValue("source_hash: must be hex", "source_hash") from None
        if not isinstance(source_hash, (bytes, bytearray, memoryview)):
            raise BadValue("source_hash: must be hex", "source_hash")
        return _sealed(
            Lineage(
                self._text(agent, "lineage agent"),
                ids[0],
                ids[1],
                parse_time(source_created_at, "source_created_at"),
                bytes(source_hash),
            )
        )

    def window_lineage(self, agent: Any, summary_id: Any) -> WindowLineage:
        return _sealed(
            WindowLineage(name(agent, "agent"), integer(summary_id, "summary_id", 1, 2**63 - 1))
        )

    def blocked_source(
        self, source: Any, reason: Any = None, blocked_at: Any = None
    ) -> BlockedSource:
        source = name(source, "source")
        if reason is not None:
            reason = self._text(
                check_value(reason, "reason", self.limits.value_bytes), "block reason"
            )
        when = None if blocked_at is None else parse_time(blocked_at, "blocked_at")
        stored = self._text(
            source, "blocked source"
        )  # a writer's source is matched in this form too (allow)
        self.blocking.update(source_forms(source) + (stored,))
        return _sealed(BlockedSource(stored, reason, when))


def renumbered(entry: HistoryEntry, version: int) -> HistoryEntry:
    """An admitted history entry under the next free version of its key (an import's merge)."""
    admitted(entry, HistoryEntry)
    return _sealed(
        dataclasses.replace(entry, version=integer(version, "history version", 1, 2**62))
    )


def writing_on(conn: Memory, source: str | None) -> bool:
    """Whether a record from `source` is written on `conn` inside the writing() transaction of a gate that allowed
    that source, so that it is looked at again before the commit."""
    return any(admit.covers(source) for admit in conn.gates)


@functools.lru_cache(maxsize=4096)
def stored_name(source: str) -> str:
    """A source's name as the gate stores it in redact mode: every secret in it a marker (a blocked
    `https://user:pw@feeds...` is kept, listed and exported so, and still refuses the writer that names it)."""
    from memctl import redact

    return redact.redact_text(source) or source


def source_forms(source: str) -> tuple[str, ...]:
    """The names a source is blocked under: as given and as stored (the same for most); the stored one last."""
    clean = stored_name(source)
    return (source,) if clean == source else (source, clean)


def refuse(source: str, reason: str | None, *, late: bool = False) -> None:
    because = f": {reason}" if reason else ""
    state = (
        "was blocked while this write ran (nothing of the write was kept)" if late else "is blocked"
    )
    raise Blocked(
        f"source {source!r} {state}{because} (memctl source unblock {source!r} to allow it again)"
    )


SOURCES_KEPT = 10_000  # distinct sources a write keeps for confirm()
CHECK_BLOCKED_ANY = "SELECT source, reason FROM memctl_blocked(%s) ORDER BY source LIMIT 1"  # sql/0023, for agents too
BLOCKED = "SELECT source, reason FROM blocked_sources"
