"""memctl db: the embedded server and schema migrations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, target, warn
from memctl.cli.render import Format, render, render_one
from memctl.db import embedded, migrate

app = typer.Typer(help="Database: the embedded server and schema migrations.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="db")


@app.command()
def start() -> None:
    """Start the embedded PostgreSQL (it stays running until `memctl db stop`); managed: only checks it runs."""
    info = embedded.start(report=warn)
    owner = f"managed by {embedded.MANAGED_UNIT}, socket {info.socket_dir}" if info.managed else f"pid {info.pid}"
    warn(f"embedded database running ({owner}, data {info.pgdata})")


@app.command()
def stop() -> None:
    """Stop the embedded PostgreSQL (a managed one is refused: systemctl stop memctl-db.service)."""
    warn("embedded database stopped" if embedded.stop() else "embedded database was not running")


@app.command()
def serve(
    socket_dir: Annotated[Optional[Path], typer.Option(
        "--socket-dir", help="Directory of the server's Unix socket [default: MEMCTL_HOME/run].",
        show_default=False)] = None,
    port: Annotated[int, typer.Option("--port", help="The port number in the socket's name (no TCP).")]
    = 5432,
) -> None:
    """Run the embedded PostgreSQL in the foreground until SIGTERM/SIGINT (fast, clean shutdown).

    The socket (0770) admits this user's group: its members connect, as the operator's shell and agents do.
    For memctl-db.service (`memctl systemd install`). Makes MEMCTL_HOME managed: from then on every memctl
    sharing the home connects to this server and never starts or stops one (remove MEMCTL_HOME/managed to
    undo). Creates the data directory and memctl's database if missing; refuses to run as root.
    """
    from memctl.db import serve as serve_mod

    raise typer.Exit(serve_mod.serve(socket_dir, port, report=warn))


@app.command()
def status(fmt: FormatOption = Format.table) -> None:
    """Is the embedded server running, where is its data, which database is in use."""
    info = embedded.status()
    chosen = target()
    from memctl.config import mask_url

    render_one({
        "database": "embedded" if chosen.embedded else mask_url(chosen.url),
        "chosen_by": chosen.origin,
        "embedded_running": info.running,
        "embedded_pid": info.pid if info.running else None,
        "embedded_data": str(info.pgdata),
        "embedded_managed_by": embedded.MANAGED_UNIT if info.managed else None,
    }, fmt)


@app.command()
def url() -> None:
    """Print a URL psql accepts for the embedded database (starting it if needed)."""
    sys.stdout.write(embedded.start(report=warn).url + "\n")


@app.command("migrate")
def migrate_(
    list_only: Annotated[bool, typer.Option("--list", help="Show applied and pending migrations; change nothing.")]
    = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Apply pending sql/NNNN_*.sql files in order, each in a transaction, recording its checksum.

    After `db distribute` (a Citus coordinator), tables a migration added are placed as distribute places them.
    First checks the server: PostgreSQL 15 or newer, pgvector 0.8.0 or newer, and the `vector` extension
    created in this database or creatable by this role; otherwise exits 1 saying what a superuser must run.
    """
    conn = connect(migrate=False)
    if list_only:
        rows = [{"name": m.name, "status": m.status, "applied_at": m.applied_at, "checksum": m.checksum[:12]}
                for m in migrate.plan(conn)]
        render(rows, fmt)
        return
    from memctl import places
    from memctl.write import erased

    with places.key_for_migrations(conn, erased.load_key()):  # sql/0024 rekeys digests under it
        applied = migrate.apply(conn, report=warn)
    warn(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")
    from memctl.db import cluster

    if cluster.is_distributed(conn):  # a Citus cluster: tables a migration added go where their kind belongs
        placed = [p.table for p in cluster.distribute(conn) if p.action == "done"]
        if placed:
            warn(f"distributed by agent or made reference tables: {', '.join(placed)}")
    render(({"name": m.name, "status": m.status} for m in applied), fmt)


@app.command()
def distribute(fmt: FormatOption = Format.table) -> None:
    """On a Citus coordinator: distribute memctl's tables by agent, co-located with episodes (run after migrate).

    Episodes, chunks, every model's vector table, the embed queue and failures, access records, summary
    lineage and runbook runs become distributed by agent; migrations, models and blocked sources become
    reference tables; facts, their history and the job log stay on the coordinator. Rows already there move
    to the shards. Idempotent; refuses (exit 1) on a server without Citus.
    """
    from memctl.db import cluster

    placements = cluster.distribute(connect())
    done = sum(p.action == "done" for p in placements)
    warn(f"{done} table(s) placed now" if done else "every table already in place")
    render((p.to_dict() for p in placements), fmt)
