"""memctl erasure verify, and the --receipt of purge, fact delete --erase and episode delete."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, target, warn
from memctl.cli.render import Format, render, to_json
from memctl.errors import EXIT_ERROR

app = typer.Typer(help="The erasure ledger: what purges, fact erasures and episode deletes removed, and the "
                       "check that none of it is back.", no_args_is_help=True)

ReceiptOption = Annotated[Optional[str], typer.Option(
    "--receipt", metavar="FILE|-", help="Write a JSON receipt: rows removed per table, the vacuum that ran, and "
    "where copies can still be (backups and exports memctl made before, WAL, replicas); '-' for stdout "
    "(instead of the usual output). Schema: docs/retention.md.", show_default=False)]
MATCH_COLUMNS = ["table", "row", "column", "erasure", "op", "what", "erased_at"]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="erasure")


def write_receipt(destination: str, op: str, *, ledger: str | None, target_: dict, removed: dict,
                  vacuum: dict | None) -> None:
    """Build the receipt and write it: to stdout, or to FILE whole (0600, fsynced, renamed into place)."""
    from memctl.backup import erasure

    data = erasure.receipt(connect(), settings(), op=op, ledger=ledger, target=target_, removed=removed,
                           vacuum=vacuum)
    text = to_json(data) + "\n"
    if destination == "-":
        sys.stdout.write(text)
        return
    from memctl import files

    files.write_text(destination, text)
    backups = data["copies"]["backups"]
    warn(f"receipt written to {destination}" + (f"; {len(backups)} backup(s) made before still hold it"
                                                 if backups else ""))


@app.command()
def verify(
    backup: Annotated[Optional[str], typer.Option(
        "--backup", metavar="FILE", help="Check this backup instead (restored into a scratch database, as "
        "`memctl backup verify` does).", show_default=False)] = None,
    scratch_url: Annotated[Optional[str], typer.Option(
        "--scratch-url", envvar="MEMCTL_SCRATCH_URL", show_default=False,
        help="With --backup: an empty database to restore into (for a role without CREATEDB).")] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Check that no erased text is back: every episode, chunk, fact and fact history value, and every
    purged source's episodes, against the keyed digests in the erasure ledger (table and file, synced first).

    Prints each row that matches (table, row, column, the erasure); exit 1 if any does, or if some entries
    cannot be tested (their key is gone).
    """
    from memctl.backup import erasure

    conn = connect()
    if backup:
        from memctl.backup import restore

        found = restore.verify_backup(conn, target().url, backup, scratch_url=scratch_url)
    else:
        found = erasure.verify(conn)
    render(found["matches"], fmt, columns=MATCH_COLUMNS if fmt in (Format.table, Format.csv) else None)
    where = f"the backup {backup} ({found['backup_created_at']})" if backup else "live memory"
    if found.get("newer_than_backup"):
        warn(f"{len(found['newer_than_backup'])} erasure(s) are newer than the backup; a restore re-applies them: "
             + "; ".join(found["newer_than_backup"][:10]))
    if found["untestable"]:
        warn(f"{found['untestable']} ledger entr(ies) were made under another key (the key file was lost or "
             "replaced): their digests cannot be tested")
    if found["matches"]:
        tables = sorted({m["table"] for m in found["matches"]})
        warn(f"erasure verify failed: {len(found['matches'])} row(s) in {where} hold erased text "
             f"({', '.join(tables)})")
        raise typer.Exit(EXIT_ERROR)
    if found["untestable"]:
        raise typer.Exit(EXIT_ERROR)
    warn(f"erasure verified: no row in {where} matches any of {found['entries']} ledger entr(ies)")
