"""memctl status: counts, backlog, last runs, warnings."""

from __future__ import annotations

from typing import Annotated

import typer

from memctl.cli.common import FormatOption, connect, warn
from memctl.cli.render import Format, render_one
from memctl.errors import EXIT_ERROR
from memctl.observe import status as status_mod


def register(root: typer.Typer) -> None:
    root.command("status")(status)


def status(
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="For monitoring: exit 1 when any warning stands (the report is printed as usual).",
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Episodes, chunks, the embedding backlog (pending, failed, oldest age), the active model, the last runs,
    the last backup and its age.

    Warns (on stderr, and as `warnings` in the report) when the last successful embed, prune or backup is older
    than twice its \\[schedule], when the last backup failed, when the oldest pending chunk is older than the
    embed schedule allows, and when chunks failed to embed.
    """
    report = status_mod.collect(connect(reading=True))  # reads only: a newer schema is a warning
    render_one(report, fmt)
    for message in report["warnings"]:
        warn(f"warning: {message}")
    if check and report["warnings"]:
        raise typer.Exit(EXIT_ERROR)
