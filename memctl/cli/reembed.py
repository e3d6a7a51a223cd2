"""memctl reembed: change the embedding model while search keeps working (start, run, switch, drop-old)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, warn
from memctl.cli.render import Format, render, render_one

app = typer.Typer(
    help="Change the embedding model: start (new vector table), run (backfill from the stored texts, then "
    "index), status, compare (how results would change), switch (atomic), drop-old (return the space); "
    "or abort. Search uses the active model until switch.",
    no_args_is_help=True,
)


ToleranceOption = Annotated[
    Optional[float],
    typer.Option(
        "--tolerance",
        min=0.0,
        max=1.0,
        help="How much lower the new model's recall@k may be before switch refuses "
        "it (default 0.02).",
    ),
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="reembed")


@app.command()
def start(
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            help="The new model, e.g. nomic-embed-text (default: the configured [embedding] model).",
        ),
    ] = None,
    embedder: Annotated[
        Optional[str],
        typer.Option(
            "--embedder", "-e", help="ollama, local or hash (default: the configured embedder)."
        ),
    ] = None,
    dims: Annotated[
        Optional[int],
        typer.Option(
            "--dims", min=1, help="Ask the model for fewer dimensions (Ollama's `dimensions`)."
        ),
    ] = None,
    halfvec: Annotated[
        bool, typer.Option("--halfvec", help="Store vectors as halfvec (up to 4,000 dims).")
    ] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Create the new model's vector table and queue every chunk for it (the configured model by default).

    Refuses dimensions HNSW cannot index: over 2,000 as vector (use --halfvec up to 4,000) or
    over 4,000 (use --dims).
    """
    from memctl.reembed import reembed

    result = reembed.start(
        connect(vector=True), model=model, embedder=embedder, dims=dims, halfvec=halfvec
    )
    render_one(result, fmt)
    warn(f"{result['queued']} chunk(s) queued for {result['model']}: run `memctl reembed run`")


class ProgressBar:
    """A one-line bar with rate and ETA on stderr."""

    WIDTH = 30

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.drawn = False

    def __call__(self, p: dict) -> None:
        if p["phase"] == "index":
            self.stream.write(
                f"\r{p['done']}/{p['total']} embedded; building the HNSW index...\033[K"
            )
        else:
            done, total = p["done"], max(p["total"], 1)
            filled = int(self.WIDTH * min(done / total, 1.0))
            rate = f"{p['rate']:.1f}/s" if p.get("rate") else "-"
            eta = _duration(p["eta_s"]) if p.get("eta_s") is not None else "-"
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{p['total']} "
                f"{done / total:4.0%} {rate} ETA {eta}\033[K"
            )
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return (
        f"{hours}h{minutes:02d}m"
        if hours
        else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")
    )


@app.command()
def run(
    batch_size: Annotated[
        Optional[int],
        typer.Option(
            "--batch-size",
            "-b",
            min=1,
            help="Chunks per embedder call (default [embedding] batch_size).",
        ),
    ] = None,
    limit: Annotated[
        Optional[int], typer.Option("--limit", "-n", min=1, help="Stop after this many chunks.")
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Queue again the chunks the new model refused.")
    ] = False,
    progress: Annotated[
        Optional[bool],
        typer.Option(
            "--progress/--no-progress",
            help="Progress bar and ETA on stderr (default: when stderr is a terminal).",
        ),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Backfill the new model from the stored texts, then build its HNSW index (CONCURRENTLY).

    Resumable and safe to kill at any moment: run it again to continue. Search keeps using the active
    model; writes meanwhile are queued for both models. Exit 3 if the embedder is unreachable.
    """
    from memctl.reembed import reembed

    st = settings()
    show = sys.stderr.isatty() if progress is None else progress
    bar = ProgressBar() if show else None

    def on_warning(message: str) -> None:
        if bar is not None and bar.drawn:
            bar.close()
            bar.drawn = False
        warn(message)

    try:
        result = reembed.run(
            connect(vector=True),
            batch_size=batch_size or st.embedding.batch_size,
            limit=limit,
            retry_failed=retry_failed,
            progress=bar,
            on_warning=on_warning,
        )
    finally:
        if bar is not None:
            bar.close()
    render_one({k: v for k, v in result.items() if k != "warnings"}, fmt)
    if result["failed"]:
        warn(
            f"{result['failed']} chunk(s) refused by the new model: `memctl reembed run --retry-failed`"
        )
    elif result["pending"]:
        warn(f"{result['pending']} chunk(s) still queued: run `memctl reembed run` again")
    elif result["index"] in ("built", "valid"):
        warn(
            "backfill complete and indexed: `memctl reembed compare`, then `memctl reembed switch`"
        )


@app.command()
def status(fmt: FormatOption = Format.table) -> None:
    """Done / total, rate, ETA, index state and the next step of a model change."""
    from memctl.reembed import reembed

    render_one(reembed.status(connect()), fmt)


@app.command()
def compare(
    sample: Annotated[
        int,
        typer.Option("--sample", "-n", min=1, help="Sample queries: first sentences of episodes."),
    ] = 20,
    queries: Annotated[
        Optional[str],
        typer.Option(
            "--queries",
            "-q",
            help='Known items: JSONL lines {"query": ..., "episodes": [ids]} or {"query": ..., '
            '"texts": [...]} (the episodes holding each text); a plain line is a query for the overlap only.',
        ),
    ] = None,
    k: Annotated[
        int, typer.Option("-k", min=1, max=1000, help="Top-k episodes compared per query.")
    ] = 10,
    tolerance: ToleranceOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """recall@k and MRR of the active and the new model side by side, and the overlap (0..1) of their
    vector top-k episodes for sample queries.

    Without --queries the known items are built from the memory itself: episodes each asked for by one
    of their sentences, with that sentence left out of what is embedded (docs/size-and-model-changes.md).
    These are the figures `switch` goes by.
    """
    from memctl.reembed import quality, reembed

    tolerance = quality.TOLERANCE if tolerance is None else tolerance
    result = reembed.compare(
        connect(vector=True), sample=sample, queries=queries, k=k, tolerance=tolerance
    )
    if result["warning"]:
        warn(result["warning"])
    measured = result["quality"]
    warn(measured["note"])
    if fmt is Format.json:
        render_one(result, fmt)
        return
    if measured["active"] is not None:
        render(
            [measured["active"], measured["new"]],
            fmt,
            columns=["model", f"recall@{k}", "mrr", "queries"],
        )
    if fmt is Format.table and not measured.get("judged", True):
        sys.stdout.write(
            "\nthese known items cannot judge a switch: `switch` will refuse it without --queries\n"
        )
    elif fmt is Format.table and measured["worse"]:
        sys.stdout.write(
            f"\nthe new model finds less beyond the tolerance ({tolerance}): `switch` will refuse it\n"
        )
    if fmt is not Format.table:
        return
    sys.stdout.write("\n")
    render(result["rows"], fmt, columns=["query", "overlap", "active_top", "new_top"])
    if result["rows"]:
        sys.stdout.write(
            f"\nmean_overlap {result['mean_overlap']} over {result['queries']} queries, "
            f"k={result['k']}: {result['active']} -> {result['new']}\n"
        )


@app.command()
def switch(
    accept_worse: Annotated[
        bool,
        typer.Option(
            "--accept-worse", help="Switch even when the new model finds less than the active one."
        ),
    ] = False,
    queries: Annotated[
        Optional[str],
        typer.Option(
            "--queries",
            "-q",
            help="Known items to measure on (as `compare --queries`); default: built from "
            "the memory.",
        ),
    ] = None,
    k: Annotated[int, typer.Option("-k", min=1, max=1000, help="recall@k and MRR at this k.")] = 10,
    tolerance: ToleranceOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Make the new model the active one, atomically, if it finds no less than the active one.

    Refuses unless backfilled and indexed; then measures both models' recall@k and MRR on the same
    known items (as `compare`) and refuses (exit 1, both figures printed) when the new model's recall
    is lower by more than --tolerance, unless --accept-worse. Where the active model itself finds almost
    none of the known items built from the memory (recall@k under 0.2: log-like, templated text), the
    gate cannot judge and refuses unless --queries FILE or --accept-worse. With nothing to measure (an
    empty memory) it switches and says so. The job log (`memctl jobs --job reembed-switch`) keeps the figures.
    Search, recall and `memctl embed` follow the database's active model at once, also where the
    configuration still names the old one (they warn until it is changed: printed on stderr).
    """
    from memctl.reembed import quality, reembed

    tolerance = quality.TOLERANCE if tolerance is None else tolerance
    result = reembed.switch(
        connect(vector=True), accept_worse=accept_worse, queries=queries, k=k, tolerance=tolerance
    )
    warn(quality.figures(result["quality"]))
    if result["accepted_worse"]:
        warn("the new model finds less than the old one: switched because of --accept-worse")
    elif not result["quality"].get("judged", True):
        warn("the known items could not judge this switch: switched because of --accept-worse")
    render_one({key: v for key, v in result.items() if key not in ("config", "quality")}, fmt)
    config = result["config"]
    warn(
        f"switched: {result['new']} is active, {result['old']} is retired "
        "(`memctl reembed drop-old` returns its space)"
    )
    warn(
        f"search, recall and embed use it now; to stop their warning, point the configuration at it: "
        f"{config['env']}"
    )
    warn("or in the config file:\n" + config["toml"].rstrip())


@app.command("drop-old")
def drop_old(fmt: FormatOption = Format.table) -> None:
    """Drop retired models' vector tables and report the space returned (their pg_total_relation_size)."""
    from memctl.reembed import reembed

    dropped = reembed.drop_old(connect())
    if not dropped:
        warn("no retired model to drop")
        return
    render(dropped, fmt)
    warn(f"returned {sum(d['bytes_returned'] for d in dropped):,} bytes")


@app.command()
def abort(fmt: FormatOption = Format.table) -> None:
    """Drop the new model's table and queue; the active model is untouched."""
    from memctl.reembed import reembed

    render_one(reembed.abort(connect()), fmt)
