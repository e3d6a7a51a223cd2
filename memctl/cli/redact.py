"""memctl redact: secrets already in the database, found and (with --fix --yes) rewritten."""

from __future__ import annotations

from typing import Annotated

import typer

from memctl.cli.common import FormatOption, connect, warn
from memctl.cli.render import Format, render
from memctl.errors import UsageError
from memctl.records import redact_scan

app = typer.Typer(
    help="Secrets in memory: find them where they already are (written before redaction, or with "
    '[redaction] mode = "off") and replace them.',
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="redact")


@app.command()
def scan(
    fix: Annotated[
        bool,
        typer.Option(
            "--fix",
            help="Rewrite what was found: redact episodes (re-chunked and re-queued), facts, job and run "
            "records; clear the values from fact history as `fact delete --erase` does.",
        ),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", help="With --fix: really rewrite (otherwise a dry run).")
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Report every secret in episodes, chunks, facts, fact history, jobs and runbook runs: table, id, column,
    kinds; never the value. Exit 0 whether or not something was found; `-f json` for scripts."""
    if yes and not fix:
        raise UsageError("--yes goes with --fix")
    conn = connect()
    found = redact_scan.scan(conn)
    render([h.to_dict() for h in found.hits], fmt)
    if not found.hits:
        warn("no secrets found")
        return
    warn(
        f"{len(found.hits)} secret location(s): {len(found.episodes)} episode(s), {len(found.facts)} fact(s), "
        f"{len(found.history)} fact history row(s), {len(found.jobs)} job(s), {len(found.runs)} runbook run(s)"
    )
    if not fix:
        warn("run `memctl redact scan --fix --yes` to rewrite them")
        return
    if not yes:
        warn("dry run: add --yes to rewrite them")
        return
    done = redact_scan.fix(conn, found)
    warn(
        "fixed: "
        + ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in done.to_dict().items())
    )
