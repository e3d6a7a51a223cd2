"""memctl erasure verify and receipt, and the --receipt of purge, fact delete --erase and episode delete."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, target, warn
from memctl.cli.render import Format, render, to_json
from memctl.errors import EXIT_ERROR, DiskFull, MemctlError

app = typer.Typer(
    help="The erasure ledger: what purges, fact erasures and episode deletes removed, and the "
    "check that none of it is back.",
    no_args_is_help=True,
)

ReceiptOption = Annotated[
    Optional[str],
    typer.Option(
        "--receipt",
        metavar="FILE|-",
        help="Write a JSON receipt: rows removed per table, the vacuum that ran, and "
        "where copies can still be (backups and exports memctl made before, WAL, replicas); '-' for stdout "
        "(instead of the usual output). Schema: docs/retention.md.",
        show_default=False,
    ),
]
MATCH_COLUMNS = ["table", "row", "column", "erasure", "op", "what", "erased_at"]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="erasure")


def erased_note(count: int) -> str:
    """What an import says of the records it left out because the erasure ledger holds them."""
    return (
        f"left out {count} record(s) erased here before (the erasure ledger holds their digests: memctl "
        "erasure verify); no option brings an erased record back"
    )


def summaries_note(ids: list[int], pruned: int) -> str:
    """What an erasure says of the summaries it removed with the episodes they were built from."""
    shown = ", ".join(map(str, ids[:10])) + (" ..." if len(ids) > 10 else "")
    lost = (
        f"; {pruned} of their sources had been pruned already, and what they said went with the summary"
        if pruned
        else ""
    )
    return (
        f"also deleted {len(ids)} summar{'y' if len(ids) == 1 else 'ies'} built from them (ids {shown}), never "
        f"rewritten by a model; the next memctl summarize rebuilds those windows from the episodes left{lost}"
    )


def check_receipt(destination: str | None, option: str = "--receipt") -> None:
    """Before anything is erased: a receipt FILE memctl can write whole (a regular file or a new one, in a
    directory that exists and is writable), or '-'; else exit 2, nothing erased."""
    import os

    from memctl import files
    from memctl.errors import BadValue

    if destination is None or destination == "-":
        return
    try:
        path = files.regular_target(destination, option)
    except BadValue as exc:
        raise BadValue(f"{exc}; nothing was erased", option) from None
    parent = path.parent
    if not parent.is_dir():
        raise BadValue(
            f"{option} {destination!r}: the directory {str(parent)!r} does not exist; nothing was "
            "erased",
            option,
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadValue(
            f"{option} {destination!r}: the directory {str(parent)!r} is not writable by this user; "
            "nothing was erased",
            option,
        )


class ReceiptOnFullDisk(DiskFull):
    """The erasure happened, and its receipt met a full disk (exit 5): said as it is, not as "nothing was half
    written, run the command again", which would find nothing left to erase."""

    def __init__(self, message: str, destination: str):
        MemctlError.__init__(self, f"disk full: {message}")
        self.disk = f"the disk holding {destination}"


def write_receipt(
    destination: str,
    op: str,
    *,
    ledger: str | None,
    target_: dict,
    removed: dict,
    vacuum: dict | None,
) -> None:
    """Build the receipt and write it: to stdout, or to FILE whole (0600, fsynced, renamed into place). Called after
    the erasure: a failure says that the erasure happened and where the ledger holds it."""
    from memctl.backup import erasure

    _deliver(
        destination,
        ledger,
        lambda: erasure.receipt(
            connect(), op=op, ledger=ledger, target=target_, removed=removed, vacuum=vacuum
        ),
    )


def _deliver(destination: str, ledger: str | None, build) -> None:
    from memctl import errors, files
    from memctl.records import erasures

    failure = None
    try:
        data = build()
        text = to_json(data) + "\n"
        if destination == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        with files.atomic_write(destination) as handle:
            handle.write(text)
    except BrokenPipeError:
        raise
    except (OSError, MemctlError) as exc:
        failure = exc
    if failure is not None:
        why = (
            failure.strerror if isinstance(failure, OSError) and failure.strerror else str(failure)
        )
        message = (
            f"the erasure happened and is recorded (ledger entry {ledger}, in the table erasures and in "
            f"{erasures.ledger_path()}), but its receipt could not be written to {destination}: {why}; "
            f"`memctl erasure receipt {(ledger or '')[:12]} --out {destination}` writes it again"
        )
        full = isinstance(failure, OSError) and errors.no_space(failure)
        raise (ReceiptOnFullDisk(message, destination) if full else MemctlError(message))
    backups = data["copies"]["backups"]
    warn(
        f"receipt written to {destination}"
        + (f"; {len(backups)} backup(s) made before still hold it" if backups else "")
    )


@app.command()
def receipt(
    entry: Annotated[
        str,
        typer.Argument(
            metavar="ID",
            help="The erasure's id in the ledger, or its first 8 or more "
            "characters (a receipt and `erasure verify` name it).",
        ),
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            metavar="FILE|-",
            help="Where to write it: a regular file (written whole, 0600), or '-' for stdout.",
        ),
    ] = "-",
) -> None:
    """Write an erasure's receipt again, from the erasure ledger: for a receipt lost, or one that could not be
    written when the erasure ran (a full disk). The rows removed are the ones the ledger counted; which vacuum
    ran is not recorded there. Exit 4 if no erasure has that id."""
    from memctl.backup import erasure

    check_receipt(out, "--out")
    conn = connect()
    found = erasure.find_entry(conn, entry)
    _deliver(out, found.id, lambda: erasure.reissue(conn, found))


@app.command()
def verify(
    backup: Annotated[
        Optional[str],
        typer.Option(
            "--backup",
            metavar="FILE",
            help="Check this backup instead (restored into a scratch database, as "
            "`memctl backup verify` does).",
            show_default=False,
        ),
    ] = None,
    scratch_url: Annotated[
        Optional[str],
        typer.Option(
            "--scratch-url",
            envvar="MEMCTL_SCRATCH_URL",
            show_default=False,
            help="With --backup: an empty database to restore into (for a role without CREATEDB).",
        ),
    ] = None,
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
    render(
        found["matches"], fmt, columns=MATCH_COLUMNS if fmt in (Format.table, Format.csv) else None
    )
    where = f"the backup {backup} ({found['backup_created_at']})" if backup else "live memory"
    if found.get("newer_than_backup"):
        warn(
            f"{len(found['newer_than_backup'])} erasure(s) are newer than the backup; a restore re-applies them: "
            + "; ".join(found["newer_than_backup"][:10])
        )
    if found["untestable"]:
        warn(
            f"{found['untestable']} ledger entr(ies) were made under another key (the key file was lost or "
            "replaced): their digests cannot be tested"
        )
    if found["matches"]:
        tables = sorted({m["table"] for m in found["matches"]})
        warn(
            f"erasure verify failed: {len(found['matches'])} row(s) in {where} hold erased text "
            f"({', '.join(tables)})"
        )
        raise typer.Exit(EXIT_ERROR)
    if found["untestable"]:
        raise typer.Exit(EXIT_ERROR)
    warn(f"erasure verified: no row in {where} matches any of {found['entries']} ledger entr(ies)")
