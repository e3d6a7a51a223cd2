"""memctl metrics: memctl's state in the Prometheus text format, on stdout or into a node_exporter textfile."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import connect, target, warn
from memctl.errors import MemctlError


def register(root: typer.Typer) -> None:
    root.command("metrics")(metrics)


def metrics(
    textfile: Annotated[
        Optional[str],
        typer.Option(
            "--textfile",
            metavar="PATH",
            help="Write to PATH (ending in .prom) atomically, for node_exporter's textfile collector, instead of "
            "stdout. When the database cannot be read, PATH still gets memctl_up 0 (and the exit code says why).",
        ),
    ] = None,
    rules: Annotated[
        bool,
        typer.Option(
            "--rules", help="Print the Prometheus alert rules shipped with memctl and exit."
        ),
    ] = False,
) -> None:
    """memctl's state for Prometheus: counts by kind and agent, the embedding backlog, models, every job's last
    run and failures, bytes by relation group, summaries overdue, version and schema (docs/metrics.md).

    The scheduled jobs refresh the textfile after each run when \\[metrics] textfile is set (memctl systemd
    renders it). Agents past the top \\[metrics] agents (20) by episodes are summed as agent="other".
    """
    from memctl.observe import metrics as metrics_mod

    if rules:
        sys.stdout.write(metrics_mod.rules_text())
        return
    path = metrics_mod.check_textfile(textfile) if textfile is not None else None
    try:
        where = target()
        conn = connect(reading=True)  # reads only: a newer schema is a warning
    except MemctlError:  # unreachable, a full disk, a schema it cannot read: memctl_up 0
        if path is not None:
            try:
                metrics_mod.write_textfile(path, metrics_mod.unavailable())
            except MemctlError as also:
                warn(str(also))
        raise
    families = metrics_mod.collect(conn, data_dir=_data_dir() if where.embedded else None)
    if path is not None:
        metrics_mod.write_textfile(path, families)
    else:
        sys.stdout.buffer.write(metrics_mod.text(families))
        sys.stdout.flush()


def _data_dir():
    from memctl.db import embedded

    return embedded.pgdata_dir()
