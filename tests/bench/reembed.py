"""Re-embedding: `memctl reembed run` chunks/s ÷ the same embedder called directly.

N chunks are stored and embedded by a cheap active model (hash). `reembed start` then
registers the target model and `reembed run` (memctl.reembed.reembed.run: queue claim with SKIP
LOCKED, embed, COPY, commit per batch, job progress, then CREATE INDEX CONCURRENTLY)
backfills it. The baseline calls the target embedder's `embed(batch)` directly on the same
texts at the same batch size. The two are interleaved in slices of --slice chunks (`reembed
run --limit`, then the embedder on the same slice's texts, alternating which goes first), so
a machine whose load drifts during the run weighs on both sides alike. Goal: ratio >= 0.9.

Two ratios are printed: the whole run (backfill and HNSW build, what an operator waits
for) and the backfill alone.

The target is the local all-MiniLM-L6-v2 (sentence-transformers, CPU) when installed,
else a hash embedder (so cheap that the ratio then mostly measures memctl's database work).

    python tests/bench/reembed.py [--chunks 2000] [--batch-size 32] [--slices 8] [--embedder local|hash]
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
    p.add_argument("--slices", type=int, default=8)
    p.add_argument("--embedder", choices=["local", "hash"], default=None)
    args = p.parse_args()
    name = local_or_hash(args.embedder)
    os.environ["MEMCTL_EMBEDDER"] = "hash"  # the active model; the target is `name`
    os.environ["MEMCTL_EMBED_MODEL"] = "hash-embed"
    os.environ["MEMCTL_CONFIG"] = "/dev/null"
    from memctl import config, db
    from memctl.embedding import worker
    from memctl.embedding.embedders import make_embedder
    from memctl.records import episodes
    from memctl.reembed import reembed

    target_model = "all-minilm" if name == "local" else "hash-target"
    rng = random.Random(5)
    texts = [
        f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40)))
        for i in range(args.chunks)
    ]
    settings = config.load()
    target = make_embedder(settings, model=target_model, embedder=name)
    target.embed(texts[: args.batch_size])  # load and warm the model before either measurement

    def direct(part: list[str]) -> None:
        for i in range(0, len(part), args.batch_size):
            target.embed(part[i : i + args.batch_size])

    n = args.chunks
    step = -(-n // args.slices // args.batch_size) * args.batch_size  # whole batches per slice
    ours = base = backfill = 0.0
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
        worker.work(conn.use_settings(settings), make_embedder(settings), batch_size=256)
        reembed.start(conn.use_settings(settings), model=target_model, embedder=name)
        for number, start in enumerate(range(0, n, step)):
            part = texts[start : start + step]
            if number % 2:
                base += timed(direct, part)[0]
            spent, report = timed(reembed.run, conn, batch_size=args.batch_size, limit=len(part))
            if not number % 2:
                base += timed(direct, part)[0]
            assert report["chunks"] == len(part), report
            ours += spent
            backfill += report["elapsed_s"]
        assert report["pending"] == 0 and report["index"] == "built", report
    print(
        f"target embedder: {name} ({target_model}), chunks: {n}, batch size: {args.batch_size}, "
        f"slices of {step}"
    )
    print(
        f"memctl reembed run:  {ours:.2f} s ({n / ours:,.1f} chunks/s), of which backfill {backfill:.2f} s "
        f"({n / backfill:,.1f} chunks/s) and HNSW build {report['index_s']:.2f} s"
    )
    print(f"embedder directly:   {base:.2f} s ({n / base:,.1f} chunks/s)")
    print(f"ratio, whole run (goal >= 0.9): {base / ours:.2f}")
    print(f"ratio, backfill only:           {base / backfill:.2f}")


if __name__ == "__main__":
    main()
