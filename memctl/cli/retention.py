"""memctl prune, purge, jobs, source: retention, cleaning up after a bad source, the job log."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, since_value, warn
from memctl.cli.erasure import ReceiptOption, check_receipt, write_receipt
from memctl.cli.render import Format, render, render_one
from memctl.errors import EXIT_ERROR, UsageError
from memctl.records import jobs as jobs_mod
from memctl.write import sources
from memctl.retention import deletion, policy as policy_mod, prune as prune_mod, purge as purge_mod

if TYPE_CHECKING:
    from memctl.db.memory import Memory

source_app = typer.Typer(
    help="Blocked sources: writes (episode add/import, fact set/import) from a blocked "
    "source are refused with exit 1 and the reason.",
    no_args_is_help=True,
)

Yes = Annotated[
    bool, typer.Option("--yes", "-y", help="Delete. Without it, a dry run that deletes nothing.")
]
BatchSize = Annotated[
    int,
    typer.Option(
        "--batch-size",
        min=1,
        help="Episodes (and for prune, job log rows) per delete transaction (short transactions: "
        "no lock held for long).",
    ),
]

SPACE_NOTE = (
    "deleted rows become dead tuples; once VACUUM has processed them (autovacuum will, or --vacuum) "
    "their space is reused by new rows, but the table files rarely shrink, so disk usage will not "
    "drop: only VACUUM FULL (an exclusive lock for the whole rewrite) or pg_repack returns it"
)
BYTES_NOTE = (
    "bytes = logical size of the episode, chunk and vector rows (every model), not file bytes; "
    "index entries are not counted"
)
PLAN_COLUMNS = [
    "kind",
    "policy",
    "rows",
    "oldest",
    "newest",
    "chunks",
    "vectors",
    "bytes",
    "kept_by_importance",
    "kept_for_summary",
    "cutoff",
]
PRUNED_COLUMNS = [
    "kind",
    "policy",
    "rows",
    "chunks",
    "vectors",
    "oldest",
    "newest",
    "remaining",
    "kept_for_summary",
    "cutoff",
]
PURGE_PLAN_COLUMNS = ["kind", "rows", "chunks", "vectors", "bytes", "oldest", "newest"]
PURGED_COLUMNS = ["kind", "rows", "chunks", "vectors", "oldest", "newest", "remaining"]
FACT_COLUMNS = ["namespace", "key", "value", "updated_at", "deleted"]
TABLE_COLUMNS = ["table", "bytes_before", "bytes_after", "dead_tuples_before", "dead_tuples_after"]
JOB_LOG_PLAN_COLUMNS = ["table", "policy", "rows", "running", "oldest", "newest", "cutoff"]
JOB_LOG_COLUMNS = ["table", "policy", "rows", "batches", "cutoff"]
JOB_COLUMNS = ["id", "job", "started_at", "finished_at", "outcome", "rows", "error"]


def register(root: typer.Typer) -> None:
    root.command("prune")(prune)
    root.command("purge")(purge)
    root.command("jobs")(jobs)
    root.add_typer(source_app, name="source")


def _mib(size: int) -> str:
    return f"{size / 1048576:.1f} MiB" if size >= 1048576 else f"{size / 1024:.1f} KiB"


def _section(rows: list[dict], fmt: Format, columns: list[str]) -> None:
    """A second table under the first, in table format only."""
    if fmt is Format.table and rows:
        sys.stdout.write("\n")
        render(rows, fmt, columns=columns)


def prune(
    yes: Yes = False,
    policy_file: Annotated[
        Optional[str],
        typer.Option(
            "--policy",
            metavar="FILE",
            help="Read the \\[retention] table of this TOML file instead of the configuration's.",
        ),
    ] = None,
    batch_size: BatchSize = deletion.DEFAULT_BATCH,
    vacuum: Annotated[
        bool,
        typer.Option(
            "--vacuum",
            help="After deleting, VACUUM (ANALYZE) the tables touched (slow on a large HNSW index).",
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Delete episodes past their kind's maximum age (\\[retention], e.g. raw = "30d"; units s m h d w y), and trim
    the job log.

    Kinds the policy does not name are kept; keep_importance = N keeps episodes of importance >= N whatever their
    age. With \\[summarize] model set, episodes of summarized kinds that no summary holds yet are kept (counted in
    kept_for_summary; \\[retention] require_summary = false turns this off). Without --yes, a dry run: per kind the rows it would delete, their oldest and newest created_at and the
    bytes they hold. With --yes, deletes in short batches (chunks and vectors of every model with their episodes),
    checks that no row still matches, and reports table sizes and dead tuples before and after; recorded in
    `memctl jobs`. A policy that names no kind deletes no episode (said on stderr), never all of them.

    The job log (`memctl jobs` and runbook runs) keeps \\[retention] jobs (default 90d, at least 1d): older rows,
    including 'running' rows left by killed processes, are deleted too, also when no episode policy is set. stdout
    lists the episode kinds; the job log counts go to stderr (and a second table in table format).
    """
    if vacuum and not yes:
        raise UsageError("--vacuum needs --yes (a dry run deletes nothing to vacuum)")
    from memctl.retention import summarize

    policy = (
        policy_mod.read_policy(policy_file)
        if policy_file
        else policy_mod.policy_from_settings(settings())
    )
    awaited = summarize.awaited_kinds(settings(), policy)
    conn = connect()
    if not yes:
        _prune_plan(conn, policy, fmt, awaited)
        return
    report = prune_mod.prune(
        conn, policy, batch_size=batch_size, run_vacuum=vacuum, await_summary=awaited
    )
    render(report.kinds, fmt, columns=PRUNED_COLUMNS)
    _section(report.tables, fmt, TABLE_COLUMNS)
    _section(report.job_log, fmt, JOB_LOG_COLUMNS)
    if policy.empty:
        warn(policy_mod.NO_EPISODE_POLICY)
    else:
        _summary("pruned", report)
    _kept_for_summary(report.kinds, awaited, planned=False)
    warn(
        "job log: deleted "
        + _job_log_counts(report.job_log)
        + f" started before {_cutoff(report.job_log)} "
        f"([retention] jobs = {policy.jobs})"
    )
    if report.outcome != "ok" and report.error is not None:
        warn(report.error)
        raise typer.Exit(EXIT_ERROR)


def _kept_for_summary(rows: list[dict], awaited: frozenset[str], *, planned: bool) -> None:
    """Say how many episodes prune keeps, and why, while summaries are missing."""
    kept = {r["kind"]: r["kept_for_summary"] for r in rows if r.get("kept_for_summary")}
    if not kept:
        return
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(kept.items()))
    warn(
        f"{'would keep' if planned else 'kept'} {counts} episode(s) past their age that no summary holds yet "
        "([summarize] model is set: memctl summarize writes them; [retention] require_summary = false "
        "deletes them unsummarized)"
    )


def _prune_plan(
    conn: Memory, policy: policy_mod.Policy, fmt: Format, awaited: frozenset[str] = frozenset()
) -> None:
    rows = prune_mod.plan(conn, policy, await_summary=awaited)
    job_log = prune_mod.job_log_plan(conn, policy)
    render(rows, fmt, columns=PLAN_COLUMNS)
    _section(job_log, fmt, JOB_LOG_PLAN_COLUMNS)
    kept = ", ".join(f"{r['kind']} ({r['rows']})" for r in prune_mod.unnamed_kinds(conn, policy))
    if policy.empty:
        warn(policy_mod.NO_EPISODE_POLICY)
    elif policy.keep_importance is not None:
        warn(
            f"episodes of importance >= {policy.keep_importance} are kept whatever their age (keep_importance)"
        )
    if kept and not policy.empty:
        warn(f"kinds without a policy are kept: {kept}")
    _kept_for_summary(rows, awaited, planned=True)
    running = sum(t["running"] for t in job_log)
    warn(
        f"dry run, nothing deleted: {sum(r['rows'] for r in rows)} episode(s), "
        f"{_mib(sum(r['bytes'] for r in rows))} ({BYTES_NOTE}); job log: "
        + _job_log_counts(job_log)
        + f" started before {_cutoff(job_log)} ([retention] jobs = {policy.jobs})"
        + (f", {running} of them still 'running' (left by killed processes)" if running else "")
        + "; run with --yes to delete"
    )


def _job_log_counts(tables: list[dict]) -> str:
    names = {"jobs": "job row(s)", "runbook_runs": "runbook-run row(s)"}
    return " and ".join(f"{t['rows']} {names[t['table']]}" for t in tables)


def _cutoff(tables: list[dict]) -> str:
    return tables[0]["cutoff"].isoformat(timespec="seconds") if tables else "?"


def _summary(verb: str, report: deletion.Report) -> None:
    warn(
        f"{verb} {report.rows} episode(s), {report.chunks} chunk(s), {report.vectors} vector(s) "
        f"in {report.batches} batch(es); longest transaction "
        f"{report.max_transaction_s:.3f} s; {report.remaining} still matching"
    )
    if report.rows:
        warn(("vacuumed. " if report.vacuumed else "") + SPACE_NOTE)


def purge(
    source: Annotated[
        str, typer.Option("--source", "-s", help="The source whose writes to remove.")
    ],
    since: Annotated[
        Optional[str],
        typer.Option(
            "--since",
            callback=since_value,
            help="Only what it wrote since: a duration back from now (7d, 12h) or an ISO date/time "
            "(facts: those it set since).",
        ),
    ] = None,
    yes: Yes = False,
    delete_facts: Annotated[
        bool,
        typer.Option(
            "--facts",
            help="Also delete the facts this source last set (history keeps their values: "
            "`memctl fact delete --erase KEY` removes those too).",
        ),
    ] = False,
    batch_size: BatchSize = deletion.DEFAULT_BATCH,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="With --yes: then VACUUM FULL every table touched (each rewritten into new files under an "
            "exclusive lock: writers and readers of memory wait) and CHECKPOINT, so no file of the database keeps "
            "the purged texts; the WAL keeps them until it is recycled.",
        ),
    ] = False,
    receipt: ReceiptOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Remove what a source wrote: its episodes with their chunks and vectors, and (--facts) the facts it last set.

    For the day a web page or a ticket turns out to have written instructions into memory. The summaries built
    from its episodes are deleted too (found through their lineage), so it does not live on inside them. Without --yes, a dry
    run: episodes per kind and the facts whose current value came from SOURCE. Block the source too
    (`memctl source block SOURCE`) so it cannot write again. Recorded in `memctl jobs`.
    """
    if (full or receipt is not None) and not yes:
        raise UsageError("--full and --receipt need --yes (a dry run erases nothing)")
    conn = connect()
    if not yes:
        found = purge_mod.purge_plan(conn, source, since)
        _purge_output(
            fmt,
            found.kinds,
            found.facts,
            PURGE_PLAN_COLUMNS,
            {
                "source": source,
                "since": found.since,
                "blocked": found.blocked,
                "dry_run": True,
                "summaries": found.summaries,
            },
        )
        _facts_note(source, found.facts, planned=True, delete_facts=delete_facts)
        _summaries_note(source, found.summaries, planned=True)
        if not found.rows and not found.facts:
            _nothing_matched(conn, source)
        warn(
            f"dry run, nothing deleted: {found.rows} episode(s) from {source!r} ({BYTES_NOTE}); "
            "run with --yes to delete"
        )
        if not found.blocked:
            warn(
                f"{source!r} is not blocked: memctl source block {source!r} --reason ... refuses its writes"
            )
        return
    check_receipt(receipt)
    report = purge_mod.purge(
        conn, source, since, delete_facts=delete_facts, batch_size=batch_size, full=full
    )
    summary = {
        k: v
        for k, v in report.to_dict().items()
        if k not in ("kinds", "facts", "tables", "job_log")
    }
    _summaries_note(source, report.summaries, planned=False)
    if receipt is not None:
        write_receipt(
            receipt,
            "purge",
            ledger=report.ledger,
            removed=report.removed,
            vacuum=report.vacuum,
            target_={
                "source": source,
                "since": since,
                "facts": [f"{f['namespace']}/{f['key']}" for f in report.facts if f["deleted"]],
            },
        )
    if receipt != "-":
        _purge_output(
            fmt,
            report.kinds,
            report.facts,
            PURGED_COLUMNS,
            {"source": source, "dry_run": False, **summary},
            tables=report.tables,
        )
    _facts_note(source, report.facts, planned=False, delete_facts=delete_facts)
    if not report.rows and not report.facts:
        _nothing_matched(conn, source)
    _summary("purged", report)
    if source not in sources.blocked_set(conn):
        warn(
            f"{source!r} is not blocked and may write again: memctl source block {source!r} --reason ..."
        )
    if report.outcome != "ok" and report.error is not None:
        warn(report.error)
        raise typer.Exit(EXIT_ERROR)


def _nothing_matched(conn: Memory, source: str) -> None:
    """Nothing from SOURCE: exit 0 as everywhere (README), said on stderr with the nearest sources that wrote."""
    near = purge_mod.near_sources(conn, source)
    warn(
        f"nothing matched: no episode or fact from source {source!r}"
        + (
            f"; did you mean {' or '.join(repr(s) for s in near)}?"
            if near
            else "; `memctl episode list --source S` and `memctl source list` show what wrote"
        )
    )


def _purge_output(
    fmt: Format, kinds: list[dict], facts: list[dict], columns: list[str], header: dict, tables=None
) -> None:
    """Two sections, episodes per kind and facts: two tables; one json object; typed jsonl/csv rows."""
    if fmt is Format.table:
        render(kinds, fmt, columns=columns)
        _section(facts, fmt, FACT_COLUMNS)
        _section(tables or [], fmt, TABLE_COLUMNS)
    elif fmt is Format.json:
        render_one(
            {**header, "episodes": kinds, "facts": facts, **({"tables": tables} if tables else {})},
            fmt,
        )
    else:
        typed = [{"type": "episodes", **k} for k in kinds] + [{"type": "fact", **f} for f in facts]
        render(typed, fmt, columns=["type", *columns, *FACT_COLUMNS])


def _summaries_note(source: str, summaries: list[dict], *, planned: bool) -> None:
    if not summaries:
        return
    ids = ", ".join(str(s["id"]) for s in summaries[:10]) + (" ..." if len(summaries) > 10 else "")
    warn(
        f"{'would also delete' if planned else 'also deleted'} {len(summaries)} summar"
        f"{'y' if len(summaries) == 1 else 'ies'} built from {source!r}'s episodes (ids {ids}), so the source does "
        "not live on inside them; the next memctl summarize rebuilds those windows from what remains"
    )


def _facts_note(source: str, facts: list[dict], *, planned: bool, delete_facts: bool) -> None:
    if not facts:
        return
    listed = ", ".join(f"{f['namespace']}/{f['key']}" for f in facts[:10]) + (
        " ..." if len(facts) > 10 else ""
    )
    if not delete_facts:
        warn(
            f"{len(facts)} fact(s) last set by {source!r}, kept (add --facts to delete them): {listed}"
        )
    elif planned:
        warn(f"{len(facts)} fact(s) last set by {source!r} would be deleted: {listed}")
    else:
        warn(
            f"deleted {sum(f['deleted'] for f in facts)} fact(s) last set by {source!r} (their history keeps the "
            "values: memctl fact history KEY; memctl fact delete --erase KEY removes them)"
        )


def jobs(
    job: Annotated[
        Optional[str],
        typer.Option(
            "--job",
            "-j",
            help="Only this job: embed, summarize, prune, purge, reembed (reembed-switch, "
            "reembed-drop-old, reembed-abort), backup, restore or export.",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="At most this many, newest first.")
    ] = 20,
    fmt: FormatOption = Format.table,
) -> None:
    """The job log: every embed, summarize, prune, purge, reembed, backup and restore run with start, end, outcome,
    rows affected and error.

    json/jsonl also carry `detail` (e.g. a prune's table sizes before and after, its longest transaction). Errors
    are stored with URL and DSN passwords masked. `memctl prune` deletes rows older than \\[retention] jobs
    (default 90d).
    """
    jobs_mod.check_name(job)
    rows = jobs_mod.list_jobs(connect(), job=job, limit=limit)
    render(rows, fmt, columns=JOB_COLUMNS if fmt in (Format.table, Format.csv) else None)


@source_app.command("block")
def block(
    source: Annotated[str, typer.Argument(help="The source, as given with --source when writing.")],
    reason: Annotated[
        Optional[str], typer.Option("--reason", "-r", help="Why; shown when a write is refused.")
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Refuse every future write from SOURCE (what it already wrote stays: see memctl purge)."""
    render([sources.block(connect(), source, reason)], fmt)


@source_app.command("unblock")
def unblock(source: Annotated[str, typer.Argument(help="A blocked source.")]) -> None:
    """Accept writes from SOURCE again; exit 4 if it was not blocked."""
    warn(f"unblocked {sources.unblock(connect(), source)!r}")


@source_app.command("list")
def list_(fmt: FormatOption = Format.table) -> None:
    """Blocked sources with their reason and when they were blocked."""
    render(sources.list_blocked(connect()), fmt)
