"""memctl summarize: roll old episodes up into summaries (with lineage) before retention deletes them."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, duration_value, settings, warn
from memctl.cli.render import Format, render
from memctl.errors import EXIT_ERROR
from memctl.retention import summarize as summarize_mod

COLUMNS = [
    "summary_id",
    "agent",
    "window_start",
    "window_end",
    "sources",
    "tokens_in",
    "tokens_out",
]
PLAN_COLUMNS = ["agent", "window_start", "window_end", "episodes", "tokens_in", "addendum_to"]


def register(root: typer.Typer) -> None:
    root.command("summarize")(summarize)


def summarize(
    older_than: Annotated[
        Optional[str],
        typer.Option(
            "--older-than",
            metavar="D",
            callback=duration_value,
            help="Only windows wholly older than this (e.g. 7d) [default: \\[summarize] "
            "after, 7d].",
            show_default=False,
        ),
    ] = None,
    agent: Annotated[
        Optional[str], typer.Option("--agent", "-a", help="Only this agent's windows.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="List the windows, their episode counts and estimated input tokens; write nothing, "
            "ask no model.",
        ),
    ] = False,
    limit: Annotated[
        Optional[int],
        typer.Option("--limit", "-n", min=1, help="At most this many windows, oldest first."),
    ] = None,
    skip_if_off: Annotated[
        bool,
        typer.Option(
            "--skip-if-off",
            help="Without \\[summarize] model, say so and exit 0 instead of 1 (for the timer).",
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Summarize old episodes, one summary per agent and UTC day, through \\[summarize] model at OLLAMA_HOST.

    Reads the episodes of \\[summarize] kinds (default: every kind with a \\[retention] limit except summary) in
    windows no summary holds yet, in time order with their times and sources, and asks the chat model for a
    factual summary that keeps names, numbers, dates, errors, causes and fixes. A window too long for the
    model's context is summarized in parts, then the parts' summaries; nothing is cut to fit. Each summary is an
    episode (kind summary, source summarize:MODEL) written with its lineage in one transaction; a rerun never
    summarizes an episode twice. Prints one row per summary written; recorded in `memctl jobs`.

    Exit 3 when Ollama is down, slow or failing (nothing written for the window in flight); exit 1 for an unknown
    model (with the `ollama pull` hint) or when a window's answer is empty, longer than its input or a refusal:
    that window is recorded in the job log and the others go on.
    """
    if skip_if_off and summarize_mod.model(settings()) is None:
        warn(
            'summaries are off: [summarize] model is not set (e.g. model = "llama3.2:3b"); nothing to do'
        )
        return
    conn = connect()
    if dry_run:
        rows = summarize_mod.plan(conn, older_than=older_than, agent=agent, limit=limit)
        render(rows, fmt, columns=PLAN_COLUMNS)
        addenda = sum(1 for r in rows if r["addendum_to"] is not None)
        warn(
            f"dry run, nothing written: {len(rows)} window(s), {sum(r['episodes'] for r in rows)} episode(s), "
            f"about {sum(r['tokens_in'] for r in rows)} input tokens (characters / 4)"
            + (
                f"; {addenda} of them add to a window summarized before (episodes backdated into it)"
                if addenda
                else ""
            )
        )
        return
    result = summarize_mod.run(conn, older_than=older_than, agent=agent, limit=limit)
    render(result.written, fmt, columns=COLUMNS)
    warn(
        f"wrote {len(result.written)} summar{'y' if len(result.written) == 1 else 'ies'}"
        + (
            f", {result.skipped} window(s) skipped (held or finished by another run)"
            if result.skipped
            else ""
        )
    )
    for failure in result.failed:
        warn(f"window {failure['agent']} {failure['window_start'][:10]} failed: {failure['error']}")
    if result.failed:
        warn(
            f"{len(result.failed)} window(s) failed and stay unsummarized (memctl jobs --job summarize); "
            "the next run tries them again"
        )
        raise typer.Exit(EXIT_ERROR)
