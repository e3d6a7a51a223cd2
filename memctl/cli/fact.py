"""memctl fact: keyed facts with history."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import (
    FormatOption,
    clock_skew,
    connect,
    connect_read,
    settings,
    since_value,
    warn,
)
from memctl.cli.erasure import ReceiptOption, check_receipt, write_receipt
from memctl.cli.render import Format, inert, render, render_one
from memctl.records import facts

app = typer.Typer(
    help="Facts: what is true now, by key, with the history of every change.", no_args_is_help=True
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="fact")


Namespace = Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the key.")]
ERASURE_COLUMNS = [
    "namespace",
    "key",
    "fact_removed",
    "history_values_erased",
    "version",
    "vacuum",
    "checkpoint",
]
Source = Annotated[
    Optional[str], typer.Option("--source", "-s", help="Who or what set this value.")
]
AsOf = Annotated[
    Optional[str],
    typer.Option(
        "--as-of",
        callback=since_value,
        help="The value valid at this time (ISO 8601, or a duration back: 3d), "
        "corrections recorded since included.",
        show_default=False,
    ),
]


def _valid_from_value(param: typer.CallbackParam, value: str | None) -> str | None:
    """--valid-from: a time as --since takes it, and not in the future (exit 2 naming the option)."""
    facts.check_valid_from(value, "--valid-from")
    return value


@app.command("set")
def set_(
    key: Annotated[str, typer.Argument(help="The key, e.g. db.port (1-255 characters).")],
    value: Annotated[str, typer.Argument(help="The new value; '-' reads it from stdin.")],
    namespace: Namespace = facts.DEFAULT_NAMESPACE,
    source: Source = None,
    valid_from: Annotated[
        Optional[str],
        typer.Option(
            "--valid-from",
            callback=_valid_from_value,
            help="When VALUE became true (ISO 8601, or a duration back: "
            "2d); default now; never in the future.",
            show_default=False,
        ),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Set KEY to VALUE; prints the key, the old value, the new value, the version and the value now current.

    With --valid-from older than the current value's, the version is history: the current value stays, and
    current_value says which it is.
    """
    from memctl.cli.common import read_text_arg

    redactor = _redactor()
    change = facts.set_fact(
        connect(),
        key,
        read_text_arg(value, "value_bytes", "value"),
        namespace=namespace,
        source=source,
        redactor=redactor,
        valid_from=valid_from,
    )
    if redactor.note():
        warn(redactor.note())
    if not change.current:
        assert (
            change.valid_from is not None
        )  # a version not current is one valid from before the current one's
        stays = "stays deleted" if change.old_value is None else f"stays {change.old_value!r}"
        warn(
            f"{key}: version {change.version} recorded as valid from {change.valid_from.isoformat()}; a version "
            f"valid from later is current, so the current value {stays} (fact history {key})"
        )
    render(
        [change.to_dict()],
        fmt,
        columns=["namespace", "key", "old_value", "new_value", "version", "current_value"],
    )


@app.command()
def get(
    key: str,
    namespace: Namespace = facts.DEFAULT_NAMESPACE,
    as_of: AsOf = None,
    fmt: Annotated[
        Optional[Format],
        typer.Option("--format", "-f", help="Omit for the bare value; json etc. for the row."),
    ] = None,
) -> None:
    """Print the bare value of KEY (so $(memctl fact get KEY) works); exit 4 if missing (or, with --as-of, if it
    had no value then)."""
    fact = facts.get_fact(
        connect_read(), key, namespace=namespace, as_of=facts.moment(as_of, "--as-of", clock_skew())
    )
    if (
        fmt is None
    ):  # the bare value is data (`$(memctl fact get k)`), on a terminal it is read: escaped there
        sys.stdout.write((inert(fact.value) if sys.stdout.isatty() else fact.value) + "\n")
    else:
        render_one(fact.to_dict(), fmt)


@app.command("list")
def list_(
    prefix: Annotated[
        Optional[str], typer.Option("--prefix", "-p", help="Only keys starting with this.")
    ] = None,
    namespace: Namespace = facts.DEFAULT_NAMESPACE,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", help="List every namespace.")
    ] = False,
    as_of: AsOf = None,
    fmt: FormatOption = Format.table,
) -> None:
    """List facts, sorted by key (with --as-of: those valid at that time)."""
    rows = (
        f.to_dict()
        for f in facts.list_facts(
            connect_read(),
            namespace=None if all_namespaces else namespace,
            prefix=prefix,
            as_of=facts.moment(as_of, "--as-of", clock_skew()),
        )
    )
    render(rows, fmt)


@app.command()
def history(
    key: str, namespace: Namespace = facts.DEFAULT_NAMESPACE, fmt: FormatOption = Format.table
) -> None:
    """Every change of KEY in the order recorded: op, old value, new value, source, version, valid_from (when it
    became true) and changed_at (when memctl recorded it)."""
    render(facts.history(connect(), key, namespace=namespace), fmt)


@app.command()
def delete(
    key: str,
    namespace: Namespace = facts.DEFAULT_NAMESPACE,
    erase: Annotated[
        bool,
        typer.Option(
            "--erase",
            help="Also clear every value from the history (a record of the erasure stays), "
            "then VACUUM both tables so the old row versions' space can be reused. VACUUM does not "
            "promise to overwrite that space, and does not touch WAL, archives, backups or replicas.",
        ),
    ] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="With --erase: VACUUM FULL facts and fact_history instead (rewrites them into "
            "new files; an exclusive lock on both while it runs), then CHECKPOINT so the WAL holding the "
            "old values can be recycled (needs superuser or pg_checkpoint).",
        ),
    ] = False,
    receipt: ReceiptOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Delete KEY (its history stays), or with --erase remove it and its history's values.

    What --erase cannot reach: WAL already written, WAL archives, base backups, dumps and replicas keep the old
    values until they age out or are rebuilt; copies in episodes stay too (run `memctl fact stale KEY` first,
    while the history still knows the old values).
    """
    from memctl.errors import UsageError

    if full and not erase:
        raise UsageError("--full needs --erase")
    if receipt is not None and not erase:
        raise UsageError("--receipt needs --erase")
    if erase:
        check_receipt(receipt)
    conn = connect()
    if erase:
        result = facts.erase_fact(conn, key, namespace=namespace, full=full)
        if receipt is not None:
            removed = {
                "facts": int(result.fact_removed),
                "fact_history_values": result.history_values_erased,
                **(result.quotes_erased or {}),
            }
            write_receipt(
                receipt,
                "fact_erase",
                ledger=result.ledger,
                removed=removed,
                target_={"namespace": namespace, "key": key},
                vacuum={
                    "ran": result.vacuum,
                    "tables": list(facts.ERASED_TABLES),
                    "checkpoint": result.checkpoint,
                    "still_in": result.still_in,
                },
            )
        if receipt != "-":
            render(
                [result.to_dict()], fmt, columns=ERASURE_COLUMNS if fmt is Format.table else None
            )
        warn(
            f"erased {key!r}: fact row {'removed' if result.fact_removed else 'already absent'}, "
            f"{result.history_values_erased} history value(s) cleared; " + _vacuum_note(result)
        )
    else:
        change = facts.delete_fact(conn, key, namespace=namespace)
        render([change.to_dict()], fmt, columns=["namespace", "key", "old_value", "version"])


def _vacuum_note(result: facts.Erasure) -> str:
    done = {
        None: "not vacuumed",
        "VACUUM": "VACUUM run (space reusable, not necessarily overwritten; --full rewrites the tables)",
        "VACUUM FULL": "VACUUM FULL run (tables rewritten)",
    }[result.vacuum]
    if result.vacuum == "VACUUM FULL":
        done += (
            ", CHECKPOINT run"
            if result.checkpoint
            else ", CHECKPOINT skipped (needs superuser or pg_checkpoint)"
        )
    return f"{done}. The old values may remain in {result.still_in}"


@app.command()
def export(
    namespace: Annotated[
        Optional[str], typer.Option("--namespace", "-n", help="Only this namespace.")
    ] = None,
) -> None:
    """Write every fact as JSONL (key, value, namespace, source, valid_from) to stdout."""
    render(facts.export_rows(connect(), namespace=namespace), Format.jsonl)


@app.command("import")
def import_(
    file: Annotated[str, typer.Argument(help="JSONL file, or '-' for stdin.")],
    source: Annotated[
        Optional[str], typer.Option("--source", "-s", help="Source for records without one.")
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Set facts from JSONL (key, value, optional namespace, source, valid_from) in one transaction.

    A bad line fails the whole import, naming the line; nothing is written.
    """
    from memctl.files import jsonl
    from memctl.write import values

    handle = jsonl.open_input(file)
    try:
        records = facts.parse_import(
            jsonl.bounded(
                handle,
                values.Limits.of(settings()).line_bytes(),
                "a fact within [limits] value_bytes",
            )
        )
    finally:
        handle.close()
    redactor = _redactor()
    changes = facts.import_facts(connect(), records, source=source, redactor=redactor)
    if redactor.note():
        warn(redactor.note())
    warn(f"imported {len(changes)} fact(s)")
    render(
        (c.to_dict() for c in changes),
        fmt,
        columns=["namespace", "key", "old_value", "new_value", "version"],
    )


@app.command()
def stale(
    key: str,
    namespace: Namespace = facts.DEFAULT_NAMESPACE,
    max_distance: Annotated[
        float,
        typer.Option(
            "--max-distance",
            min=0.0,
            max=2.0,
            help="Cosine distance under which a chunk counts as meaning the old value.",
        ),
    ] = 0.35,
    fmt: FormatOption = Format.table,
) -> None:
    """Episodes that mention a value KEY used to have, by words and by meaning: copies of a corrected fact."""
    from memctl.cli.common import settings
    from memctl.reading import stale as stale_mod

    mentions, warning = stale_mod.find(
        connect(vector=True), key, namespace=namespace, max_distance=max_distance
    )
    if warning:
        warn(warning)
    rows = [m.to_dict() for m in mentions]
    if fmt is Format.table:
        rows = [{**r, "chunk": " ".join(r["chunk"].split())[:60]} for r in rows]
    render(rows, fmt)


def _redactor():
    """The write's redactor, so the CLI can say what it replaced (count and kinds, never a value)."""
    from memctl import redact

    return redact.Redactor.from_settings(settings())
