"""memctl embed: the background worker that fills pending vectors."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, warn
from memctl.cli.render import Format, render
from memctl.errors import EXIT_UNAVAILABLE, Unavailable

if TYPE_CHECKING:
    from memctl.db.memory import Memory

MAX_BATCH = (
    10_000  # chunks per embedder call: far past any useful batch (Ollama gains little past 64)
)
# A pass claims, embeds and commits; an idle pass costs a few queries. One second between passes keeps a
# --loop worker responsive without spinning (--interval 0 once wrote 25,000 job rows in ten minutes).
MIN_INTERVAL = 1.0
COLUMNS = ["model", "chunks", "embedded", "copied", "failed", "tokens", "elapsed_s", "chunks_per_s"]

app = typer.Typer(
    help="Embed pending chunks (run by a systemd timer or with --loop).",
    invoke_without_command=True,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="embed")


@app.callback()
def embed(
    ctx: typer.Context,
    batch_size: Annotated[
        Optional[int],
        typer.Option(
            "--batch-size",
            "-b",
            min=1,
            max=MAX_BATCH,
            help="Chunks per embedder call (default [embedding] batch_size, 32).",
        ),
    ] = None,
    limit: Annotated[
        Optional[int], typer.Option("--limit", "-n", min=1, help="Stop after this many chunks.")
    ] = None,
    loop: Annotated[
        bool, typer.Option("--loop", help="Keep running: embed, sleep --interval, repeat.")
    ] = False,
    interval: Annotated[
        float,
        typer.Option("--interval", min=MIN_INTERVAL, help="Seconds between passes with --loop."),
    ] = 30.0,
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed", help="Put chunks the model refused back in the queue first."
        ),
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Embed pending chunks in batches. Exit 3 if the embedder is unreachable (rows stay pending).

    A pass with nothing to embed prints nothing and adds no row to `memctl jobs`: a streak of idle passes
    is one row (detail.idle_passes) whose finished_at moves forward, so `memctl status` sees the worker run.

    Several workers may run at once: no chunk is embedded twice, and a worker killed at any moment loses
    nothing. The first run registers the configured model as the database's active model; after that the
    database's model is used whatever the configuration names (with a warning if it differs). SIGTERM
    (`systemctl stop`) and Ctrl-C let the batch in flight commit, then stop (exit 143, 130; a second signal stops
    the batch in flight too, which rolls back); the run is logged 'interrupted'.
    """
    if ctx.invoked_subcommand is not None:
        return
    from memctl import interrupts
    from memctl.embedding.embedders import make_embedder

    st = settings()
    size = batch_size or st.embedding.batch_size
    conn = connect(vector=True)
    embedder = make_embedder(st)
    progress = _progress if sys.stderr.isatty() else None
    with (
        interrupts.deferred()
    ):  # a signal lets the batch in flight commit; a second one stops it too
        _passes(
            conn,
            st,
            embedder,
            size,
            limit=limit,
            loop=loop,
            interval=interval,
            retry_failed=retry_failed,
            progress=progress,
            fmt=fmt,
        )
    interrupts.check()


def _passes(
    conn: Memory,
    st,
    embedder,
    size: int,
    *,
    limit,
    loop: bool,
    interval: float,
    retry_failed: bool,
    progress,
    fmt: Format,
) -> None:
    from memctl import interrupts
    from memctl.db import migrate
    from memctl.embedding import worker as embed_mod

    warned: set[str] = set()
    said_idle = False
    while True:
        if loop:  # a newer memctl migrated the memory: stop (exit 75), the memctl installed now carries on
            migrate.check_unchanged(conn)
        try:
            results, notes = embed_mod.work(
                conn,
                embedder,
                batch_size=size,
                limit=limit,
                retry=retry_failed,
                progress=progress,
                should_stop=interrupts.requested,
            )
        except Unavailable as exc:
            if not loop:
                raise
            warn(f"{exc}; retrying in {interval:g}s")
            if interrupts.wait(interval):
                return
            continue
        for note in notes:
            if note not in warned:
                warn(note)
                warned.add(note)
        if results or (
            not loop and fmt is Format.json
        ):  # an idle pass is quiet (json: one `[]` document)
            render([r.to_dict() for r in results], fmt, columns=COLUMNS)
        elif not said_idle and (loop or sys.stderr.isatty()):
            warn(
                f"nothing to embed; checking again every {interval:g}s"
                if loop
                else "nothing to embed"
            )
            said_idle = True
        if interrupts.requested():
            warn(
                f"stopped by {interrupts.requested()} after the batch in flight committed; the rest stays pending"
            )
            return
        stopped = next((r.stopped_by for r in results if r.stopped_by), None)
        if stopped and not loop:
            warn(f"stopped: {stopped}; the rest stays pending")
            raise typer.Exit(EXIT_UNAVAILABLE)
        if not loop:
            return
        retry_failed = False
        if interrupts.wait(interval):
            return


def _progress(result) -> None:
    sys.stderr.write(
        f"\r{result.chunks} chunks embedded ({result.chunks / max(result.elapsed_s, 1e-9):.1f}/s)"
    )
    sys.stderr.flush()
