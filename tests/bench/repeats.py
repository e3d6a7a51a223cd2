"""Repeats folded (issue 24, docs/repeats.md): an operations corpus with repeats, loaded with folding on and off.

The corpus: one agent's week of monitoring and notes. Twenty alert rules fire in incidents (from 30 minutes to
12 hours, a new alert every five minutes while firing): twelve say the same text each time, five carry a
reading that changes hourly ("disk 91% on web-3"), three one that changes every sample ("load 3.27 on db-1":
these never fold, digits are kept); one alert in ten is written with other case or a trailing full stop (a
full stop no longer folds: punctuation is kept). Among them 300 distinct notes (deploys, tickets, findings).
The same rows are loaded by `episode import`'s library call into two fresh databases, [episodes] fold on and
off, and embedded by the hash embedder.

Printed, for each: rows stored, firsts, chunks the embed worker gets (one queue row and one vector row each,
per model), texts the embedder is asked for (the worker copies the vector of a text it embedded before, so
these are the distinct chunk texts), the import's time (the faster of --rounds alternated loads); then
distinct results (normalized texts) in the top 10 of twelve ops questions through `episode search`'s library
call, and how many of those hits are repeat rows (READ_SIDE notes what search folds); and with the local
MiniLM installed, the cosine similarity of pairs of ops texts by how they differ: the measurement behind
folding exact normalized text only (no threshold on meaning tells a paraphrase of one event from another reading, host or state of it).

    python tests/bench/repeats.py [--days 7] [--database-url URL]
"""

from __future__ import annotations

import datetime
import json
import os
import random
import statistics
import time

from _common import fresh_database, parser, server

START = datetime.datetime(2026, 3, 2, tzinfo=datetime.timezone.utc)
STATIC = [
    "health check failed for api-{n} (HTTP 503)",
    "replica lag above threshold on db-{n}",
    "nginx upstream timeouts on web-{n}",
    "certificate for shop-{n}.example.com expires soon",
    "redis evicting keys on cache-{n}",
    "kafka consumer group billing-{n} is lagging",
    "dns resolver 10.0.0.{n} answering SERVFAIL",
    "backup job on db-{n} did not start",
    "ssh login failures from 203.0.113.{n}",
    "pod crashlooping in namespace shop-{n}",
    "ntp drift over 500 ms on host-{n}",
    "queue orders-{n} has no consumers",
]
HOURLY = [
    "disk {v}% on web-{n}",
    "memory {v}% used on worker-{n}",
    "inode usage {v}% on log-{n}",
    "connection pool {v}% busy on api-{n}",
    "wal archive {v} files behind on db-{n}",
]
SAMPLE = [
    "load {v:.2f} on db-{n}",
    "p99 latency {v:.0f} ms on api-{n}",
    "error rate {v:.2f}% on web-{n}",
]
NOTES = [
    "deploy of release {a}.{b} to {svc} finished; migration took {m} minutes",
    "rolled back release {a}.{b} of {svc}: orders stuck in pending",
    "ticket OPS-{t}: customer reports slow checkout from {svc}",
    "found the cause of the {svc} timeouts: connection pool of {m} too small",
    "rotated logs on {svc}, freed {m} GB",
    "scaled {svc} from {a} to {b} replicas after the alert",
    "postmortem OPS-{t}: {svc} outage lasted {m} minutes, root cause an expired token",
]
SERVICES = "checkout billing search auth gateway cdn inventory reports mailer scheduler".split()
QUESTIONS = [
    "disk full on web-3",
    "replica lag on the database",
    "health check failures on the api",
    "certificate expiry",
    "why was the release rolled back",
    "redis eviction",
    "queue without consumers",
    "dns resolver errors",
    "slow checkout tickets",
    "memory usage on the workers",
    "backup did not run",
    "load on db-1",
]
# What the read side folds when this bench runs: search returns a first once, with its count, and leaves repeat
# rows out of the text half and the context neighbours (memctl.reading.statement), so with folding on every hit
# is a first; distinct results count distinct normalized texts among the hits either way.
READ_SIDE = "search folds: repeat rows never returned"


def corpus(days: int, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    rows: list[dict] = []
    end = START + datetime.timedelta(days=days)
    for rule in range(20):
        template, n = (STATIC + HOURLY + SAMPLE)[rule], rng.randint(1, 9)
        at = START + datetime.timedelta(minutes=rng.randint(0, 600))
        while at < end:
            length = datetime.timedelta(minutes=rng.randint(30, 720))
            base = rng.randint(80, 95)
            stop = min(at + length, end)
            while at < stop:
                if rule < 12:
                    text = template.format(n=n)
                elif rule < 17:
                    text = template.format(
                        n=n, v=min(99, base + int((at - START).total_seconds() // 3600) % 5)
                    )
                else:
                    text = template.format(n=n, v=rng.uniform(1, 40))
                if rng.random() < 0.1:
                    text = text.capitalize() + "." if rng.random() < 0.5 else text.upper()
                rows.append(
                    {
                        "content": text,
                        "kind": "alert",
                        "source": "alertmanager",
                        "agent": "ops",
                        "created_at": at.isoformat(),
                    }
                )
                at += datetime.timedelta(minutes=5)
            at += datetime.timedelta(hours=rng.randint(6, 48))
    for i in range(300):
        text = rng.choice(NOTES).format(
            a=rng.randint(1, 9),
            b=rng.randint(0, 20),
            svc=rng.choice(SERVICES),
            m=rng.randint(2, 90),
            t=4000 + i,
        )
        rows.append(
            {
                "content": text,
                "kind": "observation",
                "source": "agent",
                "agent": "ops",
                "created_at": (
                    START + datetime.timedelta(seconds=rng.randint(0, days * 86400))
                ).isoformat(),
            }
        )
    rows.sort(key=lambda r: r["created_at"])
    return rows


def load(url: str, rows: list[dict], fold: bool) -> dict:
    from memctl import config, db
    from memctl.embedding import worker
    from memctl.embedding.embedders import HashEmbedder
    from memctl.records import episodes

    settings = config.load()
    settings.episodes.fold = fold
    lines = [json.dumps(r).encode() for r in rows]
    with db.connect(url, vector=True) as conn:
        worker.work(
            conn.use_settings(settings), HashEmbedder(), batch_size=64
        )  # the model first: every chunk is queued
        result = episodes.ImportResult()
        started = time.perf_counter()
        episodes.import_episodes(
            conn.use_settings(settings),
            episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
            result=result,
        )
        elapsed = time.perf_counter() - started
        queued = conn.execute("SELECT count(*) AS n FROM embed_queue").fetchone()["n"]
        runs, _ = worker.work(conn.use_settings(settings), HashEmbedder(), batch_size=256)
        stored = conn.execute(
            "SELECT count(*) AS rows, count(*) FILTER (WHERE repeat_of IS NULL) AS firsts "
            "FROM episodes"
        ).fetchone()
        return {
            "rows": stored["rows"],
            "firsts": stored["firsts"],
            "folded": result.folded,
            "chunks": queued,
            "embedded": sum(r.embedded for r in runs),
            "copied": sum(r.copied for r in runs),
            "import_s": elapsed,
            "top10": top10(conn, settings),
        }


def top10(conn, settings) -> list[tuple[int, int]]:
    """(distinct normalized texts, hits) in the top 10 of each question: the hook for the read side's folding."""
    conn.use_settings(settings)
    from memctl.reading import query as query_mod, search as search_mod
    from memctl.write import repeats

    found = []
    for text in QUESTIONS:
        hits = search_mod.search(conn, query_mod.Query(text, k=10, agent="ops"), track=False).hits
        ids = [h.id for h in hits]
        rows = conn.execute(
            "SELECT count(*) AS n FROM episodes WHERE id = ANY(%s) AND repeat_of IS NOT NULL",
            (ids,),
        ).fetchone()["n"]
        found.append(
            (
                len({repeats.norm_hash(h.content) for h in hits}),
                len(hits),
                rows,
                sum(h.repeats for h in hits),
            )
        )
    return found


def similarities() -> None:
    """Cosine similarity of ops text pairs by how they differ, with the local all-MiniLM (when installed)."""
    try:
        from memctl.embedding.local import LocalEmbedder

        model = LocalEmbedder()
        model.embed(["warm up"])
    except Exception as exc:  # noqa: BLE001 - the measurement is optional
        print(f"meaning: skipped, no local embedder ({type(exc).__name__})")
        return
    pairs = {
        "paraphrase, same event": [
            ("disk 91% on web-3", "web-3 disk usage at 91%"),
            ("replica lag 40s on db-2", "db-2 replication is 40 seconds behind"),
            ("nginx returned 502 for /api on web-1", "web-1 nginx answering 502 on /api"),
            (
                "certificate for api.example.com expires in 6 days",
                "api.example.com TLS cert expires in six days",
            ),
            ("backup of billing took 3h", "the billing backup ran for three hours"),
            ("queue backlog 12000 on orders", "orders queue has a backlog of 12k messages"),
        ],
        "another reading": [
            ("disk 91% on web-3", "disk 97% on web-3"),
            ("replica lag 40s on db-2", "replica lag 900s on db-2"),
            (
                "certificate for api.example.com expires in 6 days",
                "certificate for api.example.com expires in 1 days",
            ),
            ("queue backlog 12000 on orders", "queue backlog 300 on orders"),
            ("CPU load 3.2 on db-1", "CPU load 35.0 on db-1"),
            ("HTTP 503 from api-3 health check", "HTTP 200 from api-3 health check"),
        ],
        "another host": [
            ("disk 91% on web-3", "disk 91% on web-4"),
            ("replica lag 40s on db-2", "replica lag 40s on db-7"),
            ("nginx returned 502 for /api on web-1", "nginx returned 502 for /api on web-9"),
            ("CPU load 3.2 on db-1", "CPU load 3.2 on cache-1"),
            ("HTTP 503 from api-3 health check", "HTTP 503 from billing-3 health check"),
            ("queue backlog 12000 on orders", "queue backlog 12000 on invoices"),
        ],
        "firing vs resolved": [
            ("disk 91% on web-3: FIRING", "disk 91% on web-3: RESOLVED"),
            ("health check failed for api-3", "health check recovered for api-3"),
            ("replica lag alert on db-2 started", "replica lag alert on db-2 cleared"),
        ],
        "unrelated": [
            ("disk 91% on web-3", "replica lag 40s on db-2"),
            (
                "nginx returned 502 for /api on web-1",
                "certificate for api.example.com expires in 6 days",
            ),
            ("backup of billing took 3h", "queue backlog 12000 on orders"),
            ("CPU load 3.2 on db-1", "HTTP 503 from api-3 health check"),
        ],
    }
    for name, group in pairs.items():
        sims = []
        for a, b in group:
            va, vb = model.embed([a, b]).vectors
            sims.append(sum(x * y for x, y in zip(va, vb)))
        print(
            f"meaning: {name:24s} cosine min {min(sims):.3f}  median {statistics.median(sims):.3f}  "
            f"max {max(sims):.3f}"
        )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=7)
    p.add_argument(
        "--rounds", type=int, default=2, help="loads of each, alternated (import time: the fastest)"
    )
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.update(
        {"MEMCTL_EMBEDDER": "hash", "MEMCTL_EMBED_MODEL": "hash-embed", "MEMCTL_CONFIG": os.devnull}
    )
    rows = corpus(args.days)
    print(
        f"corpus: {len(rows):,} episodes over {args.days} days ({sum(r['kind'] == 'alert' for r in rows):,} "
        f"alerts, {len({r['content'] for r in rows}):,} distinct texts)"
    )
    figures: dict[bool, dict] = {}
    with server(args.database_url) as admin:
        for _ in range(
            args.rounds
        ):  # alternated, each in a fresh database; the faster import of each is kept
            for fold in (False, True):
                with fresh_database(admin) as url:
                    found = load(url, rows, fold)
                if fold in figures:
                    found["import_s"] = min(found["import_s"], figures[fold]["import_s"])
                figures[fold] = found
    off, on = figures[False], figures[True]
    for name, f in (("fold off", off), ("fold on", on)):
        print(
            f"{name:8s}: rows {f['rows']:,}, firsts {f['firsts']:,}, folded {f['folded']:,}; chunks to embed "
            f"{f['chunks']:,} (embedder texts {f['embedded']:,}, vectors copied {f['copied']:,}); "
            f"import {f['import_s']:.2f} s"
        )
    print(
        f"saved by folding: {off['chunks'] - on['chunks']:,} chunks, queue rows and vector rows per model "
        f"({1 - on['chunks'] / off['chunks']:.1%}); {off['embedded'] - on['embedded']:,} embedder texts "
        f"({1 - on['embedded'] / off['embedded']:.1%}); import time ratio on/off "
        f"{on['import_s'] / off['import_s']:.2f}"
    )
    for name, f in (("fold off", off), ("fold on", on)):
        distinct = [d for d, *_ in f["top10"]]
        print(
            f"top 10, {name} ({READ_SIDE}): distinct results per question {distinct}, mean "
            f"{statistics.mean(distinct):.1f} of {statistics.mean(t[1] for t in f['top10']):.1f}; repeat rows "
            f"among the hits {sum(t[2] for t in f['top10'])}; repeats the hits stand for "
            f"{sum(t[3] for t in f['top10']):,}"
        )
    similarities()


if __name__ == "__main__":
    main()
