"""What `memctl mcp` serves: the tools an agent calls, as plain functions over one session.

Each tool takes a Session (the settings, the scope, one held connection) and returns a Reply:
the data for the protocol's structured content and the same said as text for a model to read.
The protocol itself (schemas, the MCP SDK) is memctl.mcp.protocol; nothing here imports it.

Scope: a server started for an agent reads and writes that agent's episodes only and facts
only in its namespace (plus shared namespaces it may read). Every statement says so itself:
the agent goes to search, recall and episodes.add, the namespace to the facts functions, and
the one query written here (an episode by id) names the agent in its WHERE clause. The scope is
never applied by filtering what the database answered. Without an agent the server has the
operator's view.

Writes go through the same library calls as the CLI's (episodes.add, facts.set_fact), so through
the one write gate (memctl.write.gate): blocked sources refused, secrets redacted or refused per
[redaction], importance 0 not stored.
No tool deletes, purges or runs a runbook.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Callable

from memctl.config import Settings
from memctl.errors import NotFound
from memctl.files import jsonl
from memctl.mcp.sessions import Scope, Session
from memctl.records import episodes, facts, filters
from memctl.write import gate, values

MAX_QUERY = 10_000  # characters of a query or an observation
MAX_NAME = values.MAX_NAME  # an agent, namespace, source or kind: as long as a write may store
MAX_FACTS = 500  # rows fact_list returns


# ---------------------------------------------------------------------------
# Replies


@dataclass
class Reply:
    data: dict[str, Any]
    text: str


def _when(value: str | None, what: str) -> datetime.datetime | None:
    if value is None:
        return None
    return filters.parse_since(value, what)


def _redactor(settings: Settings):
    from memctl import redact

    return redact.Redactor.from_settings(settings)


def _redacted(redactor) -> dict[str, Any]:
    return {"redacted": redactor.count, "redacted_kinds": dict(sorted(redactor.kinds.items()))}


# ---------------------------------------------------------------------------
# Episodes


def remember(
    session: Session, content: str, *, kind: str | None = None, importance: int | None = None
) -> Reply:
    """Store an episode through episodes.add, as `memctl episode add` does, as the server's agent and source."""
    scope = session.scope  # its size: the gate's [limits] episode_bytes, as for every write
    redactor = _redactor(session.settings)
    with session.connection() as conn:
        added = episodes.add_episode(
            conn,
            content,
            kind=kind,
            source=scope.source,
            agent=scope.writer,
            importance=importance,
            redactor=redactor,
        )
    new_id, stored = added.id, added.stored
    if stored is not None:  # every echo is the stored value: the names as the gate redacted them
        kind, agent, source, importance = (
            stored.kind,
            stored.agent,
            stored.source,
            stored.importance,
        )
    else:  # importance 0: nothing stored, and no text of the call is echoed but the gate's checked kind
        kind, agent, source = (
            gate.DEFAULT_KIND if kind is None else _redactor(session.settings).text(kind),
            scope.writer,
            scope.source,
        )
        importance = (
            importance if importance is not None else gate.importance_for(session.settings, kind)
        )
    data = {
        "stored": new_id is not None,
        "id": new_id,
        "agent": agent,
        "kind": kind,
        "source": source,
        "importance": importance,
        **_redacted(redactor),
    }
    if new_id is None:
        data["reason"] = f"importance 0 for kind {kind!r} (write policy [importance])"
        return Reply(data, f"Not stored: {data['reason']}.")
    note = f" Note: {redactor.note()}." if redactor.count else ""
    if added.folded_into is not None:  # a repeat: stored, linked to the first, not embedded again
        data["folded_into"] = added.folded_into
        note = f" It repeats episode {added.folded_into} and is folded into it.{note}"
    return Reply(data, f"Stored episode {new_id} ({kind}, importance {data['importance']}).{note}")


def _hit(hit) -> dict[str, Any]:
    found = {
        "id": hit.id,
        "text": hit.content,
        "score": hit.score,
        "created_at": hit.created_at.isoformat(),
        "kind": hit.kind,
        "source": hit.source,
        "agent": hit.agent,
        "importance": hit.importance,
    }
    if hit.repeats:  # a first standing for its repeats (docs/repeats.md)
        found.update(
            repeats=hit.repeats,
            first_seen=hit.first_seen.isoformat(),
            last_seen=hit.last_seen.isoformat(),
        )
    return found


def search(
    session: Session,
    query: str,
    *,
    k: int = 5,
    kind: str | None = None,
    since: str | None = None,
    until: str | None = None,
    mode: str = "hybrid",
) -> Reply:
    """Hybrid search over the scope's episodes, as `memctl episode search` runs it (filters.SINCE, filters.UNTIL)."""
    from memctl.reading import search as search_mod
    from memctl.reading.query import Query

    _when(since, "since")
    _when(until, "until")
    q = Query(query, k=k, agent=session.scope.agent, kind=kind, since=since, until=until, mode=mode)
    q.check()
    with session.connection(
        rerun=True
    ) as conn:  # hits count as accessed as in the library (its `track`)
        outcome = search_mod.search(conn, q, track=session.track)
    hits = outcome.hits
    degraded = outcome.mode != mode
    data = {
        "results": [_hit(h) for h in hits],
        "mode": outcome.mode,
        "degraded": degraded,
        "warning": outcome.warning,
    }
    note = outcome.note  # a query with no searchable word: nothing was searched
    if note:
        data["note"] = note
    lines = [f"Note: {text}." for text in (outcome.warning, note) if text]
    if not hits:
        lines.append("No episode found.")
    for h in hits:
        source = f", source {h.source}" if h.source else ""
        seen = ""
        if h.repeats:  # a first standing for its repeats: the span it was seen in
            assert h.first_seen is not None and h.last_seen is not None
            seen = (
                f", seen {h.repeats + 1} times, first {h.first_seen.isoformat(timespec='seconds')}, "
                f"last {h.last_seen.isoformat(timespec='seconds')}"
            )
        lines.append(
            f"[episode {h.id}, {h.created_at.isoformat(timespec='seconds')}, {h.kind}{source}{seen}, "
            f"score {h.score:.3f}] {h.content}"
        )
    return Reply(data, "\n".join(lines))


EPISODE = """
SELECT id, agent, kind, source, importance, created_at, meta, content FROM episodes
WHERE id = %(id)s AND agent = %(agent)s
"""
EPISODE_ANY_AGENT = """
SELECT id, agent, kind, source, importance, created_at, meta, content FROM episodes WHERE id = %(id)s
"""


def episode_get(session: Session, id: int) -> Reply:  # noqa: A002 - the tool's argument, as search names it
    """One episode by id, in scope: another agent's id is not found, exactly as a missing one."""
    agent = session.scope.agent
    with session.connection(rerun=True) as conn:
        row = conn.execute(
            EPISODE if agent is not None else EPISODE_ANY_AGENT, {"id": id, "agent": agent}
        ).fetchone()
    if row is None:
        raise NotFound(f"no episode {id}")
    data = jsonl.plain(dict(row))
    source = f", source {row['source']}" if row["source"] else ""
    return Reply(
        data,
        f"[episode {row['id']}, {data['created_at']}, {row['kind']}{source}, importance "
        f"{row['importance']}] {row['content']}",
    )


def recall(
    session: Session, observation: str, *, max_tokens: int | None = None, k: int = 5
) -> Reply:
    """The prompt-ready block `memctl recall` prints: facts of the namespace, episodes, runbooks."""
    from memctl.recall import recall as recall_mod

    scope = session.scope
    request = recall_mod.Request(
        observation,
        agent=scope.agent,
        namespace=scope.namespace,
        shared=scope.shared,
        k=k,
        max_tokens=max_tokens,
        track=session.track,
    )
    with session.connection(rerun=True) as conn:
        result = recall_mod.recall(conn, request)
    data = {
        "text": result.text(),
        **jsonl.plain(result.to_dict()),
        "degraded": result.mode != "hybrid",
        "warnings": result.warnings,
    }
    text = result.text() or "Nothing in memory is relevant to this observation."
    return Reply(data, text)


# ---------------------------------------------------------------------------
# Facts


def _fact_line(row: dict) -> str:
    return f"{row['key']} = {row['value']}"


def fact_get(
    session: Session, key: str, *, namespace: str | None = None, as_of: str | None = None
) -> Reply:
    """The current value, or with `as_of` (a duration back or an ISO time) the value valid then."""
    ns = session.scope.readable(namespace)
    at = _when(as_of, "as_of")
    with session.connection(rerun=True) as conn:
        fact = facts.get_fact(conn, key, namespace=ns, as_of=at)
    return Reply(jsonl.plain(fact.to_dict()), fact.value)


def fact_list(
    session: Session, *, prefix: str | None = None, namespace: str | None = None
) -> Reply:
    ns = session.scope.readable(namespace)
    with session.connection(rerun=True) as conn:
        rows: list[dict] = []
        for fact in facts.list_facts(conn, namespace=ns, prefix=prefix):
            if len(rows) == MAX_FACTS:
                break
            rows.append(jsonl.plain(fact.to_dict()))
    truncated = len(rows) == MAX_FACTS
    data = {"namespace": ns, "facts": rows, "truncated": truncated}
    lines = [_fact_line(r) for r in rows] or [
        f"No facts in namespace {ns!r}" + (f" under {prefix!r}." if prefix else ".")
    ]
    if truncated:
        lines.append(f"(first {MAX_FACTS} only: narrow with a prefix)")
    return Reply(data, "\n".join(lines))


def fact_set(session: Session, key: str, value: str, *, namespace: str | None = None) -> Reply:
    """Set a fact through facts.set_fact, as `memctl fact set` does, with the server's source."""
    ns = session.scope.writable(namespace)  # the value's size: the gate's [limits] value_bytes
    redactor = _redactor(session.settings)
    with session.connection() as conn:
        change = facts.set_fact(
            conn,
            key,
            value,
            namespace=ns,
            source=session.scope.source,
            redactor=redactor,
            settings=session.settings,
        )
    data = {**change.to_dict(), **_redacted(redactor)}
    was = "new" if change.old_value is None else f"was {change.old_value!r}"
    note = f" Note: {redactor.note()}." if redactor.count else ""
    return Reply(
        data, f"Set {change.key} in {change.namespace!r} (version {change.version}; {was}).{note}"
    )


def fact_history(session: Session, key: str, *, namespace: str | None = None) -> Reply:
    ns = session.scope.readable(namespace)
    with session.connection(rerun=True) as conn:
        rows = jsonl.plain(facts.history(conn, key, namespace=ns))
    lines = [
        f"v{r['version']} {r['changed_at']} {r['op']}: {r['old_value']!r} -> {r['new_value']!r}"
        + (f" (source {r['source']})" if r["source"] else "")
        + (f" (valid from {r['valid_from']})" if r["valid_from"] != r["changed_at"] else "")
        for r in rows
    ]
    return Reply({"namespace": ns, "key": key, "history": rows}, "\n".join(lines))


# ---------------------------------------------------------------------------
# Runbooks (files in git: read here, never run)


def _repository(session: Session):
    from memctl.runbooks import runbooks

    return runbooks.open_repository(None, session.settings)


def runbook_list(session: Session) -> Reply:
    rows = [
        {k: e[k] for k in ("name", "title", "description", "commit", "problem")}
        for e in _repository(session).entries()
    ]
    lines = [f"{r['name']}: {r['title'] or r['problem']}" for r in rows] or ["No runbooks."]
    return Reply({"runbooks": rows}, "\n".join(lines))


def runbook_show(session: Session, name: str, *, at: str | None = None) -> Reply:
    from memctl.runbooks import runbooks

    runbook = _repository(session).load(name, at=at)
    return Reply(jsonl.plain(runbook.to_dict()), runbooks.as_text(runbook, fenced=True))


# ---------------------------------------------------------------------------
# The catalogue: name -> (function, writes)

TOOLS: dict[str, tuple[Callable[..., Reply], bool]] = {
    "remember": (remember, True),
    "search": (search, False),
    "recall": (recall, False),
    "episode_get": (episode_get, False),
    "fact_get": (fact_get, False),
    "fact_list": (fact_list, False),
    "fact_set": (fact_set, True),
    "fact_history": (fact_history, False),
    "runbook_list": (runbook_list, False),
    "runbook_show": (runbook_show, False),
}


def offered(scope: Scope) -> list[str]:
    """The tools a server with this scope offers: no write tool at all when read-only."""
    return [name for name, (_, writes) in TOOLS.items() if not (writes and scope.read_only)]
