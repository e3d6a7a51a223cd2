"""memctl embed timing: per-chunk embedding latency and throughput, projected onto the corpus."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings
from memctl.cli.render import Format, render_one


def register(root: typer.Typer) -> None:
    from memctl.cli import embed as embed_cli

    embed_cli.app.command("timing")(timing)


def timing(
    model: Annotated[
        Optional[str], typer.Option("--model", "-m", help="Model to time (default: configured).")
    ] = None,
    embedder: Annotated[
        Optional[str],
        typer.Option("--embedder", "-e", help="ollama, local or hash (default: configured)."),
    ] = None,
    sample: Annotated[int, typer.Option("--sample", "-n", min=1, help="Chunks to time.")] = 20,
    batch_size: Annotated[
        Optional[int],
        typer.Option(
            "--batch-size",
            "-b",
            min=1,
            help="Batch size for throughput (default [embedding] batch_size).",
        ),
    ] = None,
    file: Annotated[
        Optional[str],
        typer.Option(
            "--file", help='Time these texts instead (one per line, or JSONL with "content").'
        ),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Time the embedder on sample chunks and project the cost onto the corpus.

    N representative chunks are embedded one at a time (p50_ms, p95_ms) and batched (per_s); then
    projected_s for every chunk, backlog_projected_s for the current backlog, tokens, and
    second_model_bytes, the disk a second model's vector table and index would take.
    """
    from memctl.embedding import timing as timing_mod
    from memctl.embedding.embedders import make_embedder
    from memctl.embedding.local import LOCAL_MODEL

    st = settings()
    if model is None and embedder == "local":
        model = LOCAL_MODEL
    emb = make_embedder(st, embedder=embedder, model=model)
    texts = timing_mod.read_texts(file) if file else None
    size = batch_size or st.embedding.batch_size
    render_one(timing_mod.measure(connect(), emb, sample=sample, batch_size=size, texts=texts), fmt)
