"""memctl episode: the append-only log of what happened, and its search."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memctl.cli.common import (
    FormatOption,
    batch_error,
    batch_write,
    choice_value,
    connect,
    connect_read,
    json_object,
    json_object_value,
    read_text_arg,
    settings,
    since_value,
    time_value,
    warn,
)
from memctl.cli.erasure import (
    ReceiptOption,
    check_receipt,
    erased_note,
    summaries_note,
    write_receipt,
)
from memctl.cli.render import Format, render, render_one
from memctl.errors import BadValue, UsageError
from memctl.reading import query as query_mod, search as search_mod
from memctl.records.filters import SINCE, UNTIL

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# The write path (memctl.records.episodes: the gate, redaction, the repeats fold) is imported by the
# commands that write or list, not at the top: `episode search` starts without it.

app = typer.Typer(
    help="Episodes: what happened, stored at once, embedded in the background, searched by "
    "meaning and by words.",
    no_args_is_help=True,
)

Agent = Annotated[
    Optional[str], typer.Option("--agent", "-a", help="Agent the episode belongs to.")
]
Kind = Annotated[
    Optional[str], typer.Option("--kind", help="Kind, e.g. conversation, observation, summary.")
]
SourceOpt = Annotated[
    Optional[str], typer.Option("--source", "-s", help="Where it came from (purgeable by source).")
]
Since = Annotated[
    Optional[str],
    typer.Option(
        "--since",
        callback=since_value,
        help=f"Only episodes {SINCE} a duration back (7d, 12h; at most 1000y) or ISO date.",
    ),
]
Until = Annotated[
    Optional[str],
    typer.Option(
        "--until",
        callback=since_value,
        help=f"Only episodes {UNTIL} a duration back (7d) or ISO date.",
    ),
]
MAX_LIST = 1_000_000  # rows episode list prints at most: far past a screen, short of PostgreSQL's bigint LIMIT


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="episode")


@app.command()
def add(
    text: Annotated[
        str, typer.Argument(help="The episode text, or '-' to read it from stdin (UTF-8).")
    ],
    kind: Kind = None,
    source: SourceOpt = None,
    agent: Agent = None,
    importance: Annotated[
        Optional[int],
        typer.Option(
            "--importance",
            "-i",
            min=0,
            max=10,
            help="0..10; default from [importance] in the config by kind. 0 is not stored.",
        ),
    ] = None,
    created_at: Annotated[
        Optional[str],
        typer.Option("--created-at", callback=time_value, help="ISO 8601 time (default now)."),
    ] = None,
    meta: Annotated[
        Optional[str],
        typer.Option(
            "--meta", callback=json_object_value, help="A JSON object stored with the episode."
        ),
    ] = None,
    fmt: Annotated[
        Optional[Format],
        typer.Option(
            "--format",
            "-f",
            help="Print {id, folded_into} as table, json, jsonl or csv instead of the bare id.",
        ),
    ] = None,
) -> None:
    """Store an episode and print its id. It is searchable by words at once, by meaning after `memctl embed`.

    A repeat of an earlier episode (docs/repeats.md) is stored linked to it and not embedded again: stderr says so.
    """
    from memctl.records import episodes
    from memctl.write import gate

    from memctl import redact

    st = settings()
    redactor = redact.Redactor.from_settings(st)
    added = episodes.add_episode(
        connect(),
        read_text_arg(text, "episode_bytes"),
        kind=kind,
        source=source,
        agent=agent,
        importance=importance,
        created_at=created_at,
        meta=json_object("--meta", meta),
        redactor=redactor,
    )
    if note := redactor.note():
        warn(note)
    if added.id is None:
        warn(
            f"not stored: importance 0 for kind {kind or gate.DEFAULT_KIND!r} (write policy [importance])"
        )
        return
    if added.folded_into is not None:
        warn(
            f"a repeat of episode {added.folded_into}: stored as {added.id}, linked to it, not embedded again"
        )
    if fmt is None:
        sys.stdout.write(f"{added.id}\n")
    else:
        render_one({"id": added.id, "folded_into": added.folded_into}, fmt)


@app.command("import")
def import_(
    file: Annotated[
        str, typer.Argument(help="JSONL file, or '-' for stdin: one episode per line.")
    ],
    skip_invalid: Annotated[
        bool,
        typer.Option(
            "--skip-invalid", help="Load the valid lines and report the line numbers skipped."
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Load episodes from JSONL (content required; kind, source, agent, importance, created_at, meta optional).

    One transaction: by default a malformed line fails the import, names the line, and leaves nothing behind.
    A record stored already (same agent, source, time and content: docs/ingest.md) is skipped and counted in
    already_stored, so importing a file twice changes nothing.
    """
    from memctl.records import episodes

    conn = connect()
    st = settings()
    result = episodes.ImportResult()
    from memctl.files import jsonl
    from memctl.write import values

    handle = jsonl.open_input(file)
    lines = jsonl.bounded(handle, values.Limits.of(st).line_bytes(), "an episode within [limits]")
    try:
        episodes.import_episodes(
            conn,
            episodes.parse_jsonl(st, lines, skip_invalid=skip_invalid, result=result),
            result=result,
        )
    finally:
        handle.close()
    if result.redactor is not None and (note := result.redactor.note()):
        warn(note)
    for number, reason in result.skipped[:20]:
        warn(f"skipped line {number}: {reason}")
    if len(result.skipped) > 20:
        warn(f"... and {len(result.skipped) - 20} more skipped lines")
    if result.erased:
        warn(erased_note(result.erased))
    render(
        [
            {
                "imported": result.imported,
                "chunks": result.chunks,
                "folded": result.folded,
                "already_stored": result.already,
                "dropped_by_policy": result.dropped,
                "skipped": len(result.skipped),
                "skipped_lines": [n for n, _ in result.skipped],
                "erased": result.erased,
            }
        ],
        fmt,
    )
    if result.skipped and not (
        result.imported or result.already or result.dropped or result.erased
    ):
        raise BadValue(
            "--skip-invalid: every line was invalid, nothing was imported (is this the right file?)",
            "--skip-invalid",
        )  # a skip mode's rule (README): exit 2 when nothing but skips


@app.command()
def show(
    episode_id: Annotated[int, typer.Argument(metavar="ID")], fmt: FormatOption = Format.table
) -> None:
    """One episode with its chunks and their embedding state, and its lineage: a summary's `sources` (id,
    created_at, content hash, whether it still exists) and the summaries it is in (`summarized_in`)."""
    from memctl.records import episodes

    from memctl.records import lineage

    conn = connect()
    row = episodes.show(conn, episode_id)
    row.update(lineage.lineage(conn, row["agent"], episode_id))
    if fmt is Format.table:
        chunks, sources, summarized_in = (
            row.pop("chunks"),
            row.pop("sources"),
            row.pop("summarized_in"),
        )
        row["summarized_in"] = ", ".join(str(s["id"]) for s in summarized_in) or None
        if sources:
            row["sources"] = (
                f"{len(sources)} ({sum(not s['exists'] for s in sources)} deleted since)"
            )
        render_one(row, fmt)
        sys.stdout.write("\n")
        render(chunks, fmt)
        if sources:
            sys.stdout.write("\n")
            render(sources, fmt)
    else:
        render_one(row, fmt)


@app.command("list")
def list_(
    agent: Agent = None,
    kind: Kind = None,
    source: SourceOpt = None,
    since: Since = None,
    limit: Annotated[
        int,
        typer.Option("--limit", "-n", min=1, max=MAX_LIST, help="At most this many, newest first."),
    ] = 50,
    fmt: FormatOption = Format.table,
) -> None:
    """Episodes, newest first."""
    from memctl.records import episodes

    rows = episodes.list_episodes(
        connect(), agent=agent, kind=kind, source=source, since=since, limit=limit
    )
    if fmt is Format.table:
        rows = [{**r, "content": _preview(r["content"])} for r in rows]
    render(rows, fmt)


def _preview(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@app.command()
def delete(
    ids: Annotated[list[int], typer.Argument(metavar="ID...")],
    receipt: ReceiptOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Delete episodes with their chunks and vectors of every model, and the summaries built from them; exit 4 if
    none of them existed.

    Recorded in the erasure ledger (a restore of an older backup deletes them again, an import leaves them out;
    `memctl erasure verify`). A --receipt FILE is checked before anything is deleted.
    """
    from memctl.records import episodes

    from memctl.errors import NotFound

    check_receipt(receipt)
    done = episodes.delete_episodes(connect(), ids)
    deleted = done.ids
    missing = sorted(set(ids) - set(deleted))
    if missing:
        warn(f"no such episode(s): {', '.join(map(str, missing))}")
    if not deleted:
        raise NotFound("nothing deleted")
    if done.summaries:
        warn(summaries_note(done.summaries, done.removed.get("summary_sources_pruned", 0)))
    if receipt is not None:
        write_receipt(
            receipt,
            "episode_delete",
            ledger=done.ledger.id,
            removed=done.removed,
            target_={"ids": sorted(deleted)},
            vacuum=None,
        )
    if receipt != "-":
        render(({"deleted": i} for i in sorted(deleted)), fmt)


@app.command()
def search(
    query: Annotated[
        Optional[str], typer.Argument(help="What to look for, in words; '-' reads stdin.")
    ] = None,
    k: Annotated[
        int,
        typer.Option("-k", "--k", min=1, max=query_mod.MAX_K, help="How many episodes to return."),
    ] = 5,
    agent: Agent = None,
    kind: Kind = None,
    source: SourceOpt = None,
    since: Since = None,
    until: Until = None,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            "-m",
            callback=choice_value(*query_mod.MODES),
            help="hybrid (default), vector or text.",
        ),
    ] = "hybrid",
    batch: Annotated[
        Optional[str],
        typer.Option(
            "--batch",
            help="JSONL file or '-' of queries (query, optional agent, k, kind, source, since, until, "
            "mode): "
            "writes one JSON line per query, in order.",
        ),
    ] = None,
    no_track: Annotated[
        bool,
        typer.Option(
            "--no-track",
            help="Read only: do not count the hits as accessed (access_count, last_accessed_at).",
        ),
    ] = False,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="List every repeat of a folded result right after it (repeat_of names the result).",
        ),
    ] = False,
    context: Annotated[
        int,
        typer.Option(
            "--context",
            "-C",
            min=0,
            max=10,
            help="Also N entries before and after each hit in its agent's log (same "
            "source, within [recall] window_gap), in time order, blocks merged where they meet; `match` marks the hits.",
        ),
    ] = 0,
    fmt: FormatOption = Format.table,
) -> None:
    """Find episodes by meaning and by words, weighted by recency and importance.

    A query that names a date ("in May 2026", "on 2026-11-30", "between 28 and 30 November 2026", UTC) also
    searches what was written then and favours it, over what is recent ([search] when_weight; --since/--until
    bound it instead).

    A repeated episode (docs/repeats.md) comes back once, as its first, with repeats, first_seen and last_seen
    (the table's seen column: ×N, the times it was seen).

    With the embedder down or slower than the search timeout, falls back to text search with a warning.
    Every hit returned counts as an access of that episode unless --no-track.
    With [database] read_url set, it reads from that replica and counts the accesses on the primary.
    """
    conn = connect_read(vector=True)
    if batch is not None:
        _search_batch(conn, batch, track=not no_track)
        return
    if query is None:
        raise UsageError("give a QUERY or --batch FILE")
    from memctl.recall import window

    q = query_mod.Query(
        read_text_arg(query, "episode_bytes", "query"),
        k=k,
        agent=agent,
        kind=kind,
        source=source,
        since=since,
        until=until,
        mode=mode,
    )
    outcome, rows = window.episode_search(conn, q, track=not no_track, context=context, every=every)
    if outcome.warning:
        warn(outcome.warning)
    if outcome.note:
        warn(outcome.note)
    if fmt is Format.table:
        rows = [
            {
                "id": r["id"],
                "score": "" if r["score"] is None else r["score"],
                "agent": r["agent"],
                "kind": r["kind"],
                "created_at": r["created_at"],
                "seen": _seen(r),
                **({"block": r["block"], "match": ">" if r["match"] else ""} if context else {}),
                "content": _preview(r["content"]),
            }
            for r in rows
        ]
    render(rows, fmt)


def _seen(row: dict) -> str:
    """×N for a result seen N times (itself and its repeats), 'repeat of ID' for a repeat (--all)."""
    if row.get("repeat_of") is not None:
        return f"repeat of {row['repeat_of']}"
    return f"×{row['repeats'] + 1}" if row.get("repeats") else ""


def _search_batch(conn: Memory, path: str, *, track: bool = True) -> None:
    from memctl.files import jsonl
    from memctl.write import values

    lines = jsonl.bounded(
        jsonl.open_input(path),
        values.Limits.of(settings()).line_bytes(),
        "a query within [limits]",
        "nothing was run",
    )
    slots: list = []  # a Query, or the error object of a bad line (batch_errors: the one rule of --batch)

    def refused(error) -> None:
        slots.append(batch_error(error.number, error))

    for number, item in jsonl.read(
        lines, fields=query_mod.BATCH_FIELDS, required=("query",), on_error=refused
    ):
        try:
            query = query_mod.batch_query(item, number)
            query.check()
            slots.append(query)
        except UsageError as exc:
            slots.append(batch_error(number, exc))
    queries = [s for s in slots if isinstance(s, query_mod.Query)]

    def answer(query, outcome) -> tuple[dict, list[str]]:
        line = {"query": query.text, "results": [h.to_dict() for h in outcome.hits]}
        if outcome.note:
            line["note"] = outcome.note  # why this query found nothing
        return line, [outcome.warning] if outcome.warning else []

    batch_write(
        slots, search_mod.search_batch(conn, queries, track=track) if queries else [], answer
    )
