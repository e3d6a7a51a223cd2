"""memctl size: what memory costs on disk now, and what a model would cost before any data."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect_read, settings, warn
from memctl.cli.render import Format, render, render_one

app = typer.Typer(invoke_without_command=True)


class Section(str, Enum):
    total = "total"
    relations = "relations"
    models = "models"
    kinds = "kinds"
    agents = "agents"
    growth = "growth"
    nodes = "nodes"


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="size")


@app.callback()
def size(
    ctx: typer.Context,
    section: Annotated[
        Optional[Section],
        typer.Option(
            "--section",
            "-s",
            help="Print one section only (jsonl and csv print relations unless told).",
        ),
    ] = None,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="count(*) every memctl table however large, and read every episode for kinds and agents "
            "(TOAST tables are always estimated).",
        ),
    ] = False,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="table: every relation (TOAST tables and indexes too), not only the tables.",
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Disk used by memctl: the total first, then groups, relations, models, kinds, agents, growth; `size
    estimate` before any data.

    The table starts with the total of every memctl table in human units (`total: 1.2 GiB (1,288,490,188
    bytes)`), then its groups (episodes, chunks, vectors, facts, other: each with its TOAST and indexes) largest
    first; the relations section lists the tables (--all: their TOAST tables and indexes too). json has it all
    (`total`: total_bytes, total, groups); jsonl and csv print relations, every one, unless --section says.

    One row per memctl relation (tables, TOAST, indexes, each model's vector table), each figure as psql
    reports it: rows = count(*) for a table up to 64 MiB (rows_source exact), else the statistics' estimate
    (n_live_tup, else reltuples; rows_source estimate, `note` says why; TOAST tables always, since only a
    superuser may read pg_toast); heap_bytes = pg_relation_size; toast_bytes = pg_total_relation_size of
    the TOAST table;
    index_bytes = pg_indexes_size (an index row: its pg_relation_size); map_bytes = free space and visibility maps;
    total_bytes = pg_total_relation_size; dead_tuples = pg_stat_all_tables.n_dead_tup.
    Then per model (predicted vs measured bytes per vector), per kind and per agent (data bytes of the
    episode, chunk and vector rows; from a sample of about 20,000 episodes, scaled, once episodes is
    estimated), and growth: rows per day over 7 and 30 days and the projected size in
    30, 90 and 365 days (total + rows_per_day_30d x bytes_per_episode x days).
    On a Citus coordinator the tables' figures are their shards' on the workers, summed (a reference table's
    copy on every node included), and `nodes` gives bytes per table and node.
    """
    if ctx.invoked_subcommand is not None:
        return
    from memctl.observe import size as size_mod

    report = size_mod.report(connect_read(), exact=exact)  # [database] read_url: from the replica
    for message in report["warnings"]:
        warn(message)
    if section is None and fmt in (Format.jsonl, Format.csv):
        section = Section.relations
    if section is not None:
        data = report[section.value]
        if section is Section.total:
            render_one(data, fmt) if fmt is Format.json else render(data["groups"], fmt)
        elif section is Section.growth:
            render_one(data, fmt) if fmt is Format.json else render([data], fmt)
        else:
            render(data, fmt)
        return
    if fmt is Format.json:
        render_one(report, fmt)
        return
    total = report["total"]
    sys.stdout.write(f"total: {total['total']} ({total['total_bytes']:,} bytes)\n\ngroups:\n")
    render(total["groups"], fmt)
    sys.stdout.write("\n")
    shown = {
        "relations": [r for r in report["relations"] if every or r["kind"] in ("table", "vectors")]
    }
    for name in ("relations", "models", "kinds", "agents"):
        sys.stdout.write(f"{name}:\n")
        render(shown.get(name, report[name]), fmt)
        sys.stdout.write("\n")
    sys.stdout.write("growth:\n")
    render([report["growth"]], fmt)
    if report["nodes"]:
        sys.stdout.write("\nnodes:\n")
        render(report["nodes"], fmt)


@app.command()
def estimate(
    rows: Annotated[
        int, typer.Option("--rows", "-n", min=0, help="How many chunks (vectors) to size for.")
    ],
    dims: Annotated[
        Optional[int], typer.Option("--dims", "-d", min=1, help="Vector dimensions.")
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model", "-m", help="A model name (common models known; else asked of Ollama)."
        ),
    ] = None,
    halfvec: Annotated[
        bool, typer.Option("--halfvec", help="Store as halfvec (2 bytes a dimension).")
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Bytes per vector, table, HNSW index and build memory for N rows: of one model, or of common models.

    vector takes 4 x dims + 8 bytes, halfvec 2 x dims + 8. HNSW indexes at most 2,000 dims as vector,
    4,000 as halfvec; what cannot be indexed is flagged. Needs no database.
    """
    from memctl.embedding import footprint

    st = settings() if model is not None and dims is None else None
    rows_out = footprint.estimate(rows, dims=dims, model=model, halfvec=halfvec, settings=st)
    for row in rows_out:
        if not row["indexable"]:
            warn(f"{row['model'] or str(row['dims']) + ' dims'} as {row['storage']}: {row['note']}")
    render(rows_out, fmt)
