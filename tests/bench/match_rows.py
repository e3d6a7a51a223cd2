"""Keyword recall@10 of hybrid search under [search] match_rows, by query class, with latency.

With the vector half running, the text half lets only the query's rarest words find episodes, as
many as are in `match_rows` episodes together (memctl.reading.bm25.plan); the commoner words still
score what was found. This measures what that costs keyword search: the same queries searched with
the bound and without it (match_rows = 2**31 - 1), alternated query by query in one process.

Data, built server-side (INSERT ... SELECT FROM generate_series): N episodes of 12-30 words drawn
from a vocabulary of --vocabulary words `w<rank>` with Zipf frequencies (rank r drawn as
floor((V + 1) ** u)), so document frequencies span 1 to ~600k at 1M episodes. Words are
picked by their counted document frequency into classes, scaled by N / 1M: rare df < 100, mid
1k-10k, common 50k up to 90% of the common_terms cut (their ANALYZE estimate under the cut too).
Queries are 2-4 words, seven mixes of the classes (QUERY_CLASSES), --per-class of each; a query
whose rare word is in fewer than 10 episodes is reported as "rare<10" (its top 10 needs commoner
words). At 1M the load takes about 4-5 minutes, the searches a few more.

What isolates the bound: the vector half runs (a model is registered and --embedded of the
episodes have a chunk and a vector) but its vectors are random, like the query vectors, so it
knows nothing of the words and cannot make up for what the text half misses: the recall is
keyword recall, the vector half not helping (the worst case the bound's argument leaves to it).
Fusion is set to rank by words alone (text_weight 1, recency_weight 0, importance_weight 0), so
a search's top 10 is its top 10 by BM25 among every candidate either half found.

Ground truth: the same search without the bound (every kept word finds, the text half's ORDER BY
over all matching episodes: the exact BM25 top 10). Recall@10 counts a hit of the bounded search
as right when its BM25 is at least the 10th best of the truth (ties at the cut are equal answers);
"mass" is the BM25 of the bounded top 10 ÷ the truth's. Latency: each search() call, p50/p95.

--variant adds settings to compare in the same run: `match_rows=10000` (a config value),
`match_share=0.02` (the bound is max(match_rows, that share of the episodes); a variant naming
only `match_rows=N` is that fixed bound, share 0: `match_rows=1000` is the bound before the share),
`scaled=0.01` (a fixed match_rows of that share of --episodes), and rules the code does not have,
simulated by wrapping memctl.reading.bm25.plan in this process only: `per_word=10000` (every kept
word in at most that many episodes finds, whatever the others), `pairs=10000` (also every
conjunction of two of the words that do not find, when its estimated count df_a * df_b / N is at
most that), `fill=10` (while the words and pairs that find are expected in fewer rows than that,
the next rarest word finds too). Join them with +: `match_rows=10000+pairs=10000`.

    python tests/bench/match_rows.py [--episodes 1000000] [--per-class 40]
        [--variant match_rows=10000] [--variant match_rows=10000+pairs=10000]
"""

from __future__ import annotations

import itertools
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import fresh_database, parser, percentile, server

UNBOUNDED = 2**31 - 1  # the largest match_rows the configuration takes
DIMS = 32
# Rank by words alone: a search's order is then its BM25 order (the measure is keyword recall).
WORDS_ONLY = "text_weight = 1.0\nrecency_weight = 0.0\nimportance_weight = 0.0\n"
LOAD = """
INSERT INTO episodes (agent, kind, content, content_hash, importance, created_at)
SELECT 'agent' || (g %% 10), 'observation', c.content, sha256(convert_to(c.content, 'UTF8')), 5,
       now() - make_interval(secs => g)
FROM generate_series(1, %(n)s) g
CROSS JOIN LATERAL (
    SELECT string_agg('w' || floor(exp(random() * ln(%(v)s + 1.0)))::bigint, ' ') AS content
    FROM generate_series(1, 12 + g %% 19) w WHERE g > 0
) c
"""
CHUNKS = """
INSERT INTO chunks (agent, episode_id, seq, content, content_hash)
SELECT agent, id, 0, content, content_hash FROM episodes WHERE id %% %(every)s = 0
"""
VECTORS = """
INSERT INTO {table} (agent, chunk_id, content_hash, embedding)
SELECT c.agent, c.id, c.content_hash, v.embedding
FROM chunks c CROSS JOIN LATERAL (
    SELECT array_agg(random() - 0.5)::vector({dims}) AS embedding FROM generate_series(1, {dims}) d WHERE c.id > 0
) v
"""
COUNT = "SELECT count(*) AS df FROM episodes WHERE tsv @@ %s::tsquery"
# (name, how many words of each class: rare, mid, common) -- a range picks 1 or 2 at random
QUERY_CLASSES = [
    ("rare+rare", (2, 0, 0)),
    ("rare+mid", (1, (1, 2), 0)),
    ("rare+common", (1, 0, (1, 2))),
    ("mid+mid", (0, (2, 3), 0)),
    ("mid+common", (0, (1, 2), (1, 2))),
    ("common+common", (0, 0, (2, 3))),
    ("rare+mid+common", (1, 1, (1, 2))),
]


def load(conn, n: int, vocabulary: int, embedded: float):
    """The episodes, then chunks and random vectors for `embedded` of them, an HNSW index, ANALYZE."""
    from psycopg import sql

    from memctl.embedding import models
    from memctl.embedding.embedders import HashEmbedder

    started = time.perf_counter()
    gin = conn.execute("SELECT pg_get_indexdef('episodes_tsv_idx'::regclass) AS d").fetchone()["d"]
    conn.execute(
        "DROP INDEX episodes_tsv_idx"
    )  # built once afterwards: faster than 1M inserts into it
    conn.execute("SELECT setseed(0.42)")
    conn.execute(LOAD, {"n": n, "v": vocabulary})
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(gin)
    loaded = time.perf_counter() - started
    model = models.register(
        conn, HashEmbedder("bench-random", DIMS), state="active", build_index=False
    )
    conn.execute(CHUNKS, {"every": max(1, round(1 / embedded))})
    conn.execute("DELETE FROM embed_queue")
    conn.execute(
        sql.SQL(VECTORS).format(table=sql.Identifier(model.table_name), dims=sql.Literal(DIMS))
    )
    conn.execute(models.index_statement(model, concurrently=False))
    conn.execute("VACUUM ANALYZE")
    vectors = conn.execute(
        sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(model.table_name))
    )
    print(
        f"loaded {n:,} episodes in {loaded:.0f} s; {vectors.fetchone()['n']:,} random vectors; "
        f"total {time.perf_counter() - started:.0f} s"
    )
    return model


def expected_df(rank: int, n: int, vocabulary: int) -> float:
    """Episodes expected to hold word `rank`: drawn with probability ln((r + 1) / r) / ln(V + 1), ~21 draws."""
    p = math.log((rank + 1) / rank) / math.log(vocabulary + 1)
    return n * (1 - (1 - p) ** 21)


def ranks_between(
    low: float, high: float, n: int, vocabulary: int, rng: random.Random, most: int = 400
):
    """Up to `most` ranks, log-uniform, whose expected document frequency is about within [low, high)."""

    def first(limit: float) -> int:  # the first rank expected in fewer than `limit` episodes
        lo, hi = 1, vocabulary
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if expected_df(mid, n, vocabulary) >= limit else (lo, mid)
        return lo

    top, bottom = first(high * 1.3), first(low * 0.7)
    if bottom - top <= most:
        ranks = list(range(top, bottom + 1))
        rng.shuffle(ranks)
        return ranks
    return list(
        dict.fromkeys(
            int(math.exp(rng.uniform(math.log(top), math.log(bottom)))) for _ in range(most)
        )
    )


def pick_words(
    conn, n: int, vocabulary: int, common_terms: float, rng: random.Random
) -> dict[str, dict]:
    """Words of each class -> their counted document frequency."""
    from memctl.reading import bm25

    scale = n / 1_000_000
    limits = {
        "rare": (1, max(2, 100 * scale)),
        "mid": (1000 * scale, 10000 * scale),
        "common": (50000 * scale, 0.9 * common_terms * n),
    }
    stats = bm25.term_stats(conn)
    words: dict[str, dict] = {}
    for name, (low, high) in limits.items():
        chosen: dict[str, float] = {}
        for rank in ranks_between(low, high, n, vocabulary, rng):
            word = f"w{rank}"
            df = conn.execute(COUNT, (bm25.quote(word),)).fetchone()["df"]
            # a common word's frequency as search sees it (ANALYZE's) must be under the cut too
            seen = stats.common.get(word, df / stats.n) * stats.n
            if low <= df < high and seen < common_terms * stats.n:
                chosen[word] = df
            if len(chosen) >= 60:
                break
        words[name] = chosen
        dfs = sorted(chosen.values())
        print(
            f"{name}: {len(chosen)} words, df {dfs[0]:,.0f} to {dfs[-1]:,.0f}"
            if dfs
            else f"{name}: none"
        )
        if not dfs:
            raise SystemExit(f"no {name} words: try another --vocabulary or --episodes")
    return words


def make_queries(
    words: dict[str, dict], per_class: int, rng: random.Random
) -> list[tuple[str, str]]:
    """(class, text) of each query; a rare word in fewer than 10 episodes marks its class "rare<10"."""
    queries = []
    for name, counts in QUERY_CLASSES:
        for _ in range(per_class):
            picked = []
            for cls, count in zip(("rare", "mid", "common"), counts):
                count = rng.randint(*count) if isinstance(count, tuple) else count
                picked += rng.sample(sorted(words[cls]), count) if count else []
            rng.shuffle(picked)
            few = any(words["rare"].get(w, 10) < 10 for w in picked)
            queries.append((name.replace("rare", "rare<10", 1) if few else name, " ".join(picked)))
    return queries


class Rules:
    """The bound rules the code does not have, simulated by wrapping bm25.plan (this process only)."""

    def __init__(self):
        from memctl.reading import bm25

        self.bm25, self.original, self.rule = bm25, bm25.plan, []
        bm25.plan = self.plan

    def plan(self, conn, stats, wanted, *, common_share, match_rows=None):
        if not self.rule or match_rows is None:  # as the code plans (and its fallback, unbounded)
            return self.original(
                conn, stats, wanted, common_share=common_share, match_rows=match_rows
            )
        p = self.original(conn, stats, wanted, common_share=common_share, match_rows=match_rows)
        df = dict(zip(p.terms, self.bm25.document_frequencies(conn, stats, p.terms)))
        singles, pairs = list(p.matched), []
        for kind, value in self.rule:  # in the order given
            if kind == "per_word":
                singles = [t for t in p.terms if df[t] <= value]
            elif kind == "pairs":
                rest = [t for t in p.terms if t not in singles]
                pairs = [
                    (a, b)
                    for a, b in itertools.combinations(rest, 2)
                    if df[a] * df[b] / stats.n <= value
                ]
            elif (
                kind == "fill"
            ):  # while fewer than `value` rows are expected, the next rarest word finds too
                for term in sorted((t for t in p.terms if t not in singles), key=df.get):
                    if (
                        sum(df[t] for t in singles) + sum(df[a] * df[b] / stats.n for a, b in pairs)
                        >= value
                    ):
                        break
                    singles.append(term)
                    pairs = [(a, b) for a, b in pairs if a != term and b != term]
        p.matched = singles + [f"( {a} ) & ( {b} )" for a, b in pairs]
        return p


def variants(args, scratch: Path) -> list[tuple[str, object, tuple | None]]:
    """(label, settings, simulated rule) of each search compared; the first two are always there."""
    from memctl import config

    def settings(name: str, match_rows: int | None, share: float | None = None):
        path = scratch / f"{name}.toml"
        # a fixed match_rows is the bound alone (match_share 0); a share is max(match_rows, share * N)
        if match_rows is not None and share is None:
            share = 0.0
        path.write_text(
            "[search]\n"
            + WORDS_ONLY
            + (f"match_rows = {match_rows}\n" if match_rows else "")
            + (f"match_share = {share}\n" if share is not None else "")
        )
        return config.load(path)

    out = [
        ("bounded (default: max(1000, 1% of N))", settings("default", None), None),
        ("unbounded", settings("unbounded", UNBOUNDED), None),
    ]
    for number, variant in enumerate(args.variant):
        rows, share, rule, label = None, None, [], []
        for item in variant.split("+"):
            key, _, value = item.partition("=")
            if key == "match_rows":
                rows = int(value)
            elif key == "match_share":
                share = float(value)
            elif key == "scaled":
                rows = max(1, round(float(value) * args.episodes))
            elif key in ("per_word", "pairs", "fill"):
                rule.append((key, float(value)))
            else:
                raise SystemExit(
                    f"--variant: match_rows=N, match_share=F, scaled=F, per_word=N, pairs=N, fill=N, "
                    f"joined by +, got {variant!r}"
                )
            label.append(f"{item} ({rows:,} rows)" if key == "scaled" else item)
        name = "+".join(label) + (" (simulated)" if rule else "")
        out.append((name, settings(f"variant{number}", rows, share), rule))
    return out


def recall(hits, truth) -> tuple[float, float]:
    """(tie-aware recall@10, BM25 mass) of a search's hits against the unbounded search's."""
    best = [h.text_score for h in truth if h.text_score]
    if not best:
        return 1.0, 1.0
    cut = best[-1] - 1e-6
    mine = [h.text_score for h in hits if h.text_score]
    right = sum(1 for s in mine if s >= cut)
    return min(right, len(best)) / len(best), sum(mine) / sum(best)


def run(conn, queries, compared, rules: Rules, warm: int = 7):
    """Every query searched by every variant in turn (who goes first rotates); recall and times by class."""
    from memctl.reading import search
    from memctl.reading.query import Query

    gen = np.random.default_rng(7)
    vectors = gen.normal(size=(len(queries), DIMS)).astype(np.float32)
    times = {label: {} for label, _, _ in compared}
    scores = {label: {} for label, _, _ in compared}
    no_text = {label: 0 for label, _, _ in compared}
    for (_, text), vector in list(zip(queries, vectors))[
        :: max(1, len(queries) // warm)
    ]:  # warm every path
        for _, settings, rule in compared:
            rules.rule = rule
            search.search(conn.use_settings(settings), Query(text, k=10), vector=vector)
    for i, ((cls, text), vector) in enumerate(zip(queries, vectors)):
        order = compared[i % len(compared) :] + compared[: i % len(compared)]
        outcomes = {}
        for label, settings, rule in order:
            rules.rule = rule
            started = time.perf_counter()
            outcomes[label] = search.search(
                conn.use_settings(settings), Query(text, k=10), vector=vector
            )
            times[label].setdefault(cls, []).append(time.perf_counter() - started)
        rules.rule = []
        truth = outcomes["unbounded"].hits
        for label, _, _ in compared:
            hits = outcomes[label].hits
            scores[label].setdefault(cls, []).append(recall(hits, truth))
            no_text[label] += not any(h.text_rank for h in hits)
    return times, scores, no_text


def report(queries, times, scores, no_text) -> None:
    classes = list(dict.fromkeys(cls for cls, _ in queries))
    width = max(len(label) for label in times)
    ms = 1000
    print("\nrecall@10 by class (tie-aware; queries in each class)")
    print(" " * width + "  " + " ".join(f"{c:>16}" for c in classes))
    print(
        " " * width
        + "  "
        + " ".join(f"{'n=' + str(len(scores['unbounded'][c])):>16}" for c in classes)
    )
    for label in times:
        print(
            f"{label:<{width}}  "
            + " ".join(f"{np.mean([r for r, _ in scores[label][c]]):>16.3f}" for c in classes)
        )
    print("\nlatency p50 by class (ms)")
    for label in times:
        print(
            f"{label:<{width}}  "
            + " ".join(f"{percentile(times[label].get(c, [0]), 0.5) * ms:>16.1f}" for c in classes)
        )
    print("\nall queries: recall@10, BM25 mass, loss; latency of one search() p50 / p95")
    for label in times:
        every = [x for c in classes for x in scores[label][c]]
        r, m = np.mean([x[0] for x in every]), np.mean([x[1] for x in every])
        values = [t for c in classes for t in times[label].get(c, [])]
        print(
            f"{label:<{width}}  recall {r:.3f}  mass {m:.3f}  loss {1 - r:5.1%}  "
            f"p50 {percentile(values, 0.5) * ms:7.1f} ms  p95 {percentile(values, 0.95) * ms:7.1f} ms  "
            f"[no text hit: {no_text[label]} of {len(queries)}]"
        )


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=1_000_000)
    p.add_argument("--vocabulary", type=int, default=1_000_000)
    p.add_argument("--per-class", type=int, default=40, help="queries of each class (%(default)s)")
    p.add_argument(
        "--embedded", type=float, default=0.01, help="share of episodes with a (random) vector"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="match_rows=N | match_share=F | scaled=F | per_word=N | pairs=N | fill=N, joined by + "
        "(repeatable)",
    )
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="memctl-match-rows-"))
    (scratch / "memctl.toml").write_text("")
    os.environ.update(
        MEMCTL_EMBEDDER="hash",
        MEMCTL_EMBED_MODEL="bench-random",
        MEMCTL_CONFIG=str(scratch / "memctl.toml"),
    )
    from memctl import config, db

    compared = variants(args, scratch)
    rules = Rules()
    rng = random.Random(11)
    try:
        with (
            server(args.database_url) as admin,
            fresh_database(admin) as url,
            db.connect(url, vector=True) as conn,
        ):
            load(conn, args.episodes, args.vocabulary, args.embedded)
            common_terms = config.load().search.common_terms
            words = pick_words(conn, args.episodes, args.vocabulary, common_terms, rng)
            queries = make_queries(words, args.per_class, rng)
            started = time.perf_counter()
            times, scores, no_text = run(conn, queries, compared, rules)
            print(
                f"{len(queries)} queries x {len(compared)} searches in {time.perf_counter() - started:.0f} s"
            )
            report(queries, times, scores, no_text)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
