"""memctl status: counts, backlog, last runs."""

from __future__ import annotations

import typer

from memctl import status as status_mod
from memctl.cli.common import FormatOption, connect
from memctl.cli.render import Format, render_one


def register(root: typer.Typer) -> None:
    root.command("status")(status)


def status(fmt: FormatOption = Format.table) -> None:
    """Episodes, chunks, the embedding backlog (pending, failed, oldest age), the active model, the last embed run."""
    render_one(status_mod.collect(connect()), fmt)
