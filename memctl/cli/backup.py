"""memctl backup, memctl backup verify, memctl restore: the whole database in one checked file, and back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, target, warn
from memctl.cli.render import Format, render, render_one
from memctl.errors import EXIT_ERROR, EXIT_USAGE

app = typer.Typer()  # its help is the callback's docstring: `memctl backup` alone takes a backup


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="backup")
    root.command("restore")(restore)


def _size(n: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@app.callback(invoke_without_command=True)
def backup(
    ctx: typer.Context,
    to: Annotated[
        Optional[str],
        typer.Option(
            "--to",
            help="Directory to write into (else \\[backup] dir, else MEMCTL_HOME/backups).",
            show_default=False,
        ),
    ] = None,
    keep_daily: Annotated[
        Optional[int],
        typer.Option(
            "--keep-daily",
            min=0,
            help="Keep the newest backup of each of the last N days that have one "
            "(else \\[backup] keep_daily, 7).",
            show_default=False,
        ),
    ] = None,
    keep_weekly: Annotated[
        Optional[int],
        typer.Option(
            "--keep-weekly",
            min=0,
            help="Keep the newest backup of each of the last N weeks that have one "
            "(else \\[backup] keep_weekly, 4).",
            show_default=False,
        ),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Take a backup now: pg_dump of the whole database in one snapshot, with a manifest, then rotate.

    Safe while agents write: the dump, the record counts and the checksums all read one snapshot. The file
    (memctl-backup-TIME.tar, mode 0600) appears whole or not at all. Older backups are deleted like restic's
    `forget --keep-daily N --keep-weekly M`; both 0 keeps all. `memctl backup verify FILE` checks one.
    """
    if ctx.invoked_subcommand is not None:
        return
    from memctl.backup import backup as backup_mod

    st = settings()
    directory = Path(to).expanduser() if to else backup_mod.default_dir(st)
    conn = connect()
    made = backup_mod.take(
        conn,
        target().url,
        directory,
        keep_daily=st.backup.keep_daily if keep_daily is None else keep_daily,
        keep_weekly=st.backup.keep_weekly if keep_weekly is None else keep_weekly,
    )
    render_one(made.to_dict(), fmt)
    removed = f"; removed {len(made.removed)} older backup(s)" if made.removed else ""
    warn(f"backup written to {made.path} ({_size(made.bytes)}){removed}")


@app.command("verify")
def verify(
    file: Annotated[str, typer.Argument(help="A backup file (memctl backup).")],
    scratch_url: Annotated[
        Optional[str],
        typer.Option(
            "--scratch-url",
            envvar="MEMCTL_SCRATCH_URL",
            show_default=False,
            help="An empty database to restore into, for a role that may not CREATE DATABASE "
            "(or MEMCTL_SCRATCH_URL, which `ps` does not show).",
        ),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Restore a backup into a scratch database and compare every table's rows and checksum with its manifest.

    The scratch database is created on the same server (the role needs CREATEDB) and dropped afterwards.
    Exits 1 when the file is damaged (its dump's sha256 differs) or any table differs from the manifest.
    """
    from memctl.backup import restore as restore_mod

    from memctl.backup import erasure

    conn = connect(migrate=False)
    result = restore_mod.verify(
        conn,
        target().url,
        file,
        scratch_url=scratch_url,
        inspect=lambda scratch: erasure.backup_report(conn, scratch),
    )
    render([t.to_dict() for t in result.tables], fmt)
    _erasures_note(result)
    _agents_note(result.agents)
    if not result.ok:
        why = [f"{', '.join(result.failed)} differ(s) from the manifest"] if result.failed else []
        why += (
            ["a restore there would leave agents unserved"]
            if not all(a["makes"] for a in result.agents)
            else []
        )
        warn(f"backup verify failed: {file}: {'; '.join(why)}")
        raise typer.Exit(EXIT_ERROR)
    warn(
        f"backup verified: {file} ({result.manifest['created_at']}) restores with every table as its manifest says"
    )


def restore(
    file: Annotated[str, typer.Argument(help="A backup file (memctl backup).")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Replace memctl's database with the backup's contents.")
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Replace everything in memctl's database with a backup, after a safety backup of what is there now.

    The safety backup (memctl-before-restore-TIME.tar, in the backup directory, never rotated) undoes it:
    restore that file the same way. The replacement is one transaction, checked against the manifest before
    it commits; then the schema is brought up to date. Stop agents and timers first: the restore waits at
    most 30 s for their locks. Works on an empty database (a new embedded data directory) too.
    """
    if not yes:
        warn(
            f"restore replaces everything in memctl's database with the contents of {file} (a safety backup "
            "of the current contents is written first): run again with --yes"
        )
        raise typer.Exit(EXIT_USAGE)
    from memctl.backup import backup as backup_mod, restore as restore_mod
    from memctl.records import jobs

    conn = connect(migrate=False)
    try:
        result = restore_mod.restore(
            conn, target().url, file, directory=backup_mod.default_dir(settings())
        )
    except (
        KeyboardInterrupt
    ) as exc:  # SIGINT, SIGTERM at any step: psql killed before it commits; said in the job log
        jobs.ended(conn, restore_mod.JOB, exc)
        raise
    render_one(result.to_dict(), fmt)
    if result.reapplied:
        warn(
            f"re-applied {len(result.reapplied)} erasure(s) newer than the backup (the erasure ledger: a restore "
            "never brings back what was erased): "
            + "; ".join(
                f"{r['op']} {r['what']} at {r['erased_at']} ({r.get('episodes', 0)} episode(s), "
                f"{r.get('facts', 0)} fact(s), {r.get('fact_history_values', 0)} history value(s) removed)"
                for r in result.reapplied
            )
        )
    saved = f"; the previous contents are in {result.safety}" if result.safety else ""
    warn(f"restored {file} ({result.manifest['created_at']}){saved}")
    _agents_restored(result.agents)


def _agents_note(agents: list[dict]) -> None:
    """What the drill found of the registered agents' roles on the scratch database's server."""
    for agent in agents:
        then = (
            "`memctl restore` makes it"
            if agent["makes"]
            else "this role may not make it: a restore there would leave the agent unserved until a DBA does"
        )
        warn(
            f"agent {agent['name']!r}: {agent['problem']} on that server ({agent['role']}); {then}"
        )


def _agents_restored(agents: dict) -> None:
    """The registered agents' roles after a restore: made, to be given a new login, or left to a DBA (exit 1)."""
    if agents.get("made"):
        warn(
            f"made the roles of {len(agents['made'])} registered agent(s) on this server: {', '.join(agents['made'])}"
        )
    if agents.get("logins"):
        warn(
            f"agent(s) {', '.join(agents['logins'])} had a login: `memctl agent login NAME` gives a new password"
        )
    for gap in agents.get("gaps", []):
        warn(f"agents' wall: left open: {gap}")
    if agents.get("unserved"):
        warn(f"restore done, but agents are not served: {agents['unserved']}")
        raise typer.Exit(EXIT_ERROR)


def _erasures_note(result) -> None:
    """What verify found of the erasure ledger in the backup."""
    found = result.inspected
    if not found:
        return
    if found["newer"]:
        warn(
            f"{len(found['newer'])} erasure(s) are newer than this backup; `memctl restore` re-applies them: "
            + "; ".join(found["newer"][:10])
        )
    if found["matches"]:
        warn(
            f"the backup holds {len(found['matches'])} row(s) of erased text (memctl erasure verify --backup "
            "names them)"
        )
