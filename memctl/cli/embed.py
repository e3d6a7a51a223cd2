"""memctl embed: the background worker that fills pending vectors."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, warn
from memctl.cli.render import Format, render
from memctl.errors import EXIT_UNAVAILABLE, Unavailable

app = typer.Typer(help="Embed pending chunks (run by a systemd timer or with --loop).",
                  invoke_without_command=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="embed")


@app.callback()
def embed(
    ctx: typer.Context,
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", "-b", help="Chunks per embedder call (default [embedding] batch_size, 32).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", "-n", help="Stop after this many chunks.")] = None,
    loop: Annotated[bool, typer.Option("--loop", help="Keep running: embed, sleep --interval, repeat.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between passes with --loop.")] = 30.0,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Put chunks the model refused back in the queue first.")] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Embed pending chunks in batches. Exit 3 if the embedder is unreachable (rows stay pending).

    Several workers may run at once: no chunk is embedded twice, and a worker killed at any moment loses
    nothing. The first run registers the configured model as the database's active model.
    """
    if ctx.invoked_subcommand is not None:
        return
    from memctl import embed as embed_mod
    from memctl.embedding import make_embedder

    st = settings()
    size = batch_size or st.get("embedding", "batch_size")
    conn = connect(vector=True)
    embedder = make_embedder(st)
    progress = _progress if sys.stderr.isatty() else None
    while True:
        try:
            results = embed_mod.work(conn, st, embedder, batch_size=size, limit=limit, retry=retry_failed,
                                     progress=progress)
        except Unavailable as exc:
            if not loop:
                raise
            warn(f"{exc}; retrying in {interval:g}s")
            time.sleep(interval)
            continue
        render([r.to_dict() for r in results], fmt,
               columns=["model", "chunks", "embedded", "copied", "failed", "tokens", "elapsed_s", "chunks_per_s"])
        stopped = next((r.stopped_by for r in results if r.stopped_by), None)
        if stopped and not loop:
            warn(f"stopped: {stopped}; the rest stays pending")
            raise typer.Exit(EXIT_UNAVAILABLE)
        if not loop:
            return
        retry_failed = False
        time.sleep(interval)


def _progress(result) -> None:
    sys.stderr.write(f"\r{result.chunks} chunks embedded ({result.chunks / max(result.elapsed_s, 1e-9):.1f}/s)")
    sys.stderr.flush()
