"""Embed worker: `memctl embed` chunks/s ÷ the same embedder called directly.

N chunks are stored, then embedded twice at the same batch size with the same
embedder instance (already loaded and warmed): once by the worker
(`memctl.embedding.worker.work`, what `memctl embed` runs: claim with SKIP LOCKED, embed,
COPY vectors, delete queue rows, commit, per batch) and once by calling
`embedder.embed(batch)` directly on the same texts. Goal: ratio >= 0.9.

The embedder is the local all-MiniLM-L6-v2 (sentence-transformers, CPU) when
installed, else the deterministic hash embedder (which makes the embedder so
cheap that the ratio mostly measures memctl's database work).

    python tests/bench/embed.py [--chunks 2000] [--batch-size 32] [--embedder local|hash]
"""

from __future__ import annotations

import json
import os
import random

from _common import WORDS, fresh_database, local_or_hash, parser, server, timed


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--chunks", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--embedder", choices=["local", "hash"], default=None)
    args = p.parse_args()
    name = local_or_hash(args.embedder)
    os.environ["MEMCTL_EMBEDDER"] = name
    os.environ["MEMCTL_EMBED_MODEL"] = "all-minilm" if name == "local" else "hash-embed"
    os.environ["MEMCTL_CONFIG"] = "/dev/null"
    from memctl import config, db
    from memctl.embedding import worker
    from memctl.embedding.embedders import make_embedder
    from memctl.records import episodes

    rng = random.Random(3)
    texts = [
        f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40)))
        for i in range(args.chunks)
    ]
    settings = config.load()
    embedder = make_embedder(settings)
    embedder.embed(texts[: args.batch_size])  # load and warm the model before either measurement

    def direct():
        for i in range(0, len(texts), args.batch_size):
            embedder.embed(texts[i : i + args.batch_size])

    before, _ = timed(
        direct
    )  # the baseline runs before and after the worker: load drifts are averaged
    with (
        server(args.database_url) as admin,
        fresh_database(admin) as url,
        db.connect(url, vector=True) as conn,
    ):
        result = episodes.ImportResult()
        lines = (json.dumps({"content": t}).encode() for t in texts)
        episodes.import_episodes(
            conn.use_settings(settings),
            episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
            result=result,
        )
        ours, (runs, _warnings) = timed(worker.work, conn, embedder, batch_size=args.batch_size)
        done = sum(r.chunks for r in runs)
        assert done == args.chunks, f"worker embedded {done} of {args.chunks}"
    after, _ = timed(direct)
    base = (before + after) / 2
    print(f"embedder: {name}, chunks: {args.chunks}, batch size: {args.batch_size}")
    print(f"memctl embed worker: {ours:.2f} s ({args.chunks / ours:,.1f} chunks/s)")
    print(f"embedder directly:   {base:.2f} s ({args.chunks / base:,.1f} chunks/s)")
    print(f"ratio (goal >= 0.9): {(args.chunks / ours) / (args.chunks / base):.2f}")


if __name__ == "__main__":
    main()
