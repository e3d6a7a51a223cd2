"""BM25 ranking of the text half, from term statistics PostgreSQL already keeps.

Term frequency counts as 1 and |e| is `length(tsv)`, so no text is read; document frequencies come
from `pg_stats.most_common_elems` (read once per process and database, kept STATS_TTL seconds) and,
for rare terms, from the GIN index. Plan.ceiling, the most any episode can score, scales the text
half in fusion (memctl.reading.fusion); match_bound sizes the text half's match when the vector half
runs (its rarest words, pairs of the commoner ones, common terms left out).

The formula and why each choice: docs/search.md ("BM25, exactly").
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memctl.db.memory import Memory

COMMON_MIN_ROWS = 1000  # below this many rows, matching a word is cheap whatever its share
SAMPLE_ROWS = 2000  # episodes sampled for the average length
STATS_TTL = 60.0  # seconds term statistics are reused within one process
PAIRED_TERMS = 8  # the commoner words paired to find episodes together: at most 28 pairs

STATS = """
SELECT c.reltuples::float8 AS reltuples, s.most_common_elems::text::text[] AS lexemes,
       s.most_common_elem_freqs AS freqs, a.most_common_vals::text::text[] AS agents,
       a.most_common_freqs AS agent_freqs,
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS citus
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'tsv'
LEFT JOIN pg_stats a ON a.schemaname = n.nspname AND a.tablename = c.relname AND a.attname = 'agent'
WHERE c.oid = 'episodes'::regclass
"""
COUNT_ALL = "SELECT count(*)::float8 AS n FROM episodes"
COUNT_AGENT = "SELECT count(*)::float8 AS n FROM episodes WHERE agent = %s"
AVERAGE_LENGTH = "SELECT avg(length(tsv))::float8 AS avgdl FROM episodes TABLESAMPLE SYSTEM (%s)"
# In an agent's role (Memory.as_agent) a text search also reads only the ids the text index finds among the
# agent's own episodes (memctl_agent_matches, sql/0022): under row-level security `@@` cannot use the index,
# not being LEAKPROOF, while `id = ANY($ids)` can (the function itself is not LEAKPROOF: called in a
# subquery, once per statement, its array is a parameter); the policies still filter every row read.
MATCHED = " AND e.id = ANY((SELECT memctl_agent_matches({q}::tsquery))::bigint[])"


def matched_in_role(in_role: bool, q: str) -> str:
    """The condition (' AND ...') a text search finding `q` (SQL of a tsquery text) adds in an agent's role."""
    return MATCHED.format(q=q) if in_role else ""


# One GIN scan of the rare terms together, one count per term (a plain aggregate, which Citus
# pushes down to the shards; a correlated subquery per term it cannot plan).
COUNT_TERMS = "SELECT {counts} FROM episodes e WHERE e.tsv @@ %(any)s::tsquery {matched}"
COUNT_ONE = "count(*) FILTER (WHERE e.tsv @@ {q}::tsquery)::float8 AS {name}"
# The score of one episode for the plan's terms and weights (named parameters t0.., w0..): one
# CASE per term, so each row costs a few tsquery matches and no subquery.
SCORE = """({terms}) * (%(k1)s::float8 + 1)
  / (1 + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * greatest(length({tsv}), %(avgdl)s::float8)
                                                                    / %(avgdl)s::float8))"""
TERM = "CASE WHEN {tsv} @@ {term}::tsquery THEN {weight}::float8 ELSE 0 END"

_LEXEME = re.compile(r"'((?:[^']|'')*)'")


@dataclass
class TermStats:
    """Episode count, average length and the most common lexemes' frequencies; df cache."""

    n: float
    avgdl: float
    common: dict[str, float]
    counted: dict[str, float] = field(default_factory=dict)
    common_queries: list[str] = field(default_factory=list)  # the common lexemes as tsquery texts
    agents: dict[str, float] = field(
        default_factory=dict
    )  # the most common agents' shares of episodes
    citus: bool = False  # the database is a Citus coordinator: count within an agent's shard

    def __post_init__(self):
        if not self.common_queries:
            self.common_queries = [quote(lexeme) for lexeme in self.common]

    @functools.cached_property
    def common_array(self) -> str:
        """common_queries as one text[] literal, made once: a query sends it as a plain string (dumping
        a list of a few hundred elements on every query cost more than the statement's execution)."""
        return (
            "{"
            + ",".join(
                '"' + q.replace("\\", "\\\\").replace('"', '\\"') + '"' for q in self.common_queries
            )
            + "}"
        )


_CACHE: dict[tuple, tuple[float, TermStats]] = {}


def cached_term_stats(conn: Memory, ttl: float = STATS_TTL) -> TermStats:
    """term_stats, the statistics reused for `ttl` seconds per database.

    The counts of rare terms are not reused across calls (each call gets an empty `counted`):
    an episode just added must be found by its rare words at once.
    """
    info = conn.info
    key = (info.host, info.port, info.dbname, info.user)
    now = time.monotonic()
    hit = _CACHE.get(key)
    if hit is None or now - hit[0] >= ttl:
        hit = (now, term_stats(conn))
        _CACHE[key] = hit
    stats = hit[1]
    return TermStats(
        n=stats.n,
        avgdl=stats.avgdl,
        common=stats.common,
        common_queries=stats.common_queries,
        agents=stats.agents,
        citus=stats.citus,
    )


def term_stats(conn: Memory) -> TermStats:
    row = conn.one(STATS)
    n = row["reltuples"]
    if n is None or n < 0:  # never vacuumed or analyzed: count once
        n = conn.one(COUNT_ALL)["n"]
    common = dict(zip(row["lexemes"] or [], row["freqs"] or []))
    percent = 100.0 if n <= SAMPLE_ROWS else max(0.01, 100.0 * SAMPLE_ROWS / n)
    avgdl = conn.one(AVERAGE_LENGTH, (percent,))["avgdl"]
    agents = dict(zip(row["agents"] or [], row["agent_freqs"] or []))
    return TermStats(
        n=max(n, 1.0), avgdl=avgdl or 1.0, common=common, agents=agents, citus=row["citus"]
    )


def agent_share(conn: Memory, stats: TermStats, agent: str) -> float:
    """The agent's share of all episodes: from the statistics for a common agent, else counted."""
    if agent in stats.agents:
        return stats.agents[agent]
    count = conn.one(COUNT_AGENT, (agent,))["n"]
    return min(1.0, count / stats.n)


def quote(lexeme: str) -> str:
    """deploy -> 'deploy', as PostgreSQL writes a one-lexeme tsquery."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def single_lexeme(tsquery: str) -> str | None:
    """'deploy' -> deploy; None for a phrase or several lexemes."""
    match = _LEXEME.fullmatch(tsquery.strip())
    return match.group(1).replace("''", "'") if match else None


def document_frequencies(conn: Memory, stats: TermStats, terms: list[str]) -> list[float]:
    """df of each term (a tsquery text): from the statistics when common, else counted."""
    wanted = [
        t
        for t in dict.fromkeys(terms)
        if t not in stats.counted and single_lexeme(t) not in stats.common
    ]
    if wanted:
        from psycopg import sql

        in_role = conn.in_agent_role

        params = {f"q{i}": t for i, t in enumerate(wanted)}
        params["any"] = " | ".join(f"( {t} )" for t in wanted)
        statement = sql.SQL(COUNT_TERMS).format(
            matched=sql.SQL(matched_in_role(in_role, "%(any)s")),
            counts=sql.SQL(", ").join(
                sql.SQL(COUNT_ONE).format(q=sql.Placeholder(f"q{i}"), name=sql.Identifier(f"df{i}"))
                for i in range(len(wanted))
            ),
        )
        row = conn.one(statement, params, prepare=False)
        for i, term in enumerate(wanted):
            stats.counted[term] = row[f"df{i}"]
    out = []
    for t in terms:
        lexeme = single_lexeme(t)
        out.append(
            stats.counted[t]
            if t in stats.counted or lexeme is None
            else stats.common[lexeme] * stats.n
        )
    return out


def idf(n: float, df: float) -> float:
    n = max(n, df)  # statistics older than the count (a table that grew since ANALYZE)
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


@dataclass
class Plan:
    """What the text half matches and how it weighs each term."""

    terms: list[str]  # tsquery texts, one per wanted word or phrase kept: they score
    weights: list[float]  # their idf
    left_out: list[str]  # wanted terms too common to match or score
    matched: list[str] = field(
        default_factory=list
    )  # the kept terms (and pairs of them, ANDed) that find episodes
    ceiling: float = 0.0  # the most any episode can score: one holding every kept term, not long


def match_bound(stats: TermStats, match_rows: float, match_share: float = 0.0) -> float:
    """How many episodes the finding words may be in together: match_rows, or match_share of the episodes
    when that is more. A fixed count loses keyword recall as memory grows; a share keeps the loss about
    where it is, since word frequencies grow with the corpus (the figures: docs/benchmarks.md,
    tests/bench/match_rows.py)."""
    return max(float(match_rows), match_share * stats.n)


def plan(
    conn: Memory,
    stats: TermStats,
    wanted: list[str],
    *,
    common_share: float | None,
    match_rows: float | None = None,
) -> Plan:
    """Weigh the wanted terms; with common_share, leave out those in more than that share of episodes.

    With match_rows, only the rarest kept terms whose document frequencies add up to at most
    match_rows find episodes (none, when even the rarest is in more), and pairs of the others (ANDed) expected
    in at most match_rows episodes together; without it every kept term does.
    """
    terms = list(dict.fromkeys(t for t in wanted if t))
    dfs = document_frequencies(conn, stats, terms)
    kept, weights, left_out, frequency = [], [], [], {}
    for term, df in zip(terms, dfs):
        if df == 0:
            continue
        if common_share is not None and df > common_share * stats.n and df > COMMON_MIN_ROWS:
            left_out.append(term)
            continue
        kept.append(term)
        weights.append(idf(stats.n, df))
        frequency[term] = df
    matched = list(kept)
    if match_rows is not None:
        matched, total = [], 0.0
        for term in sorted(kept, key=lambda t: frequency[t]):
            if total + frequency[term] > match_rows:
                break
            matched.append(term)
            total += frequency[term]
        # an episode holding two of the commoner words together is found by the pair, when the pair's
        # estimated co-occurrence (independent words) fits the bound: their AND reads about that many rows
        rest = sorted((t for t in kept if t not in matched), key=frequency.__getitem__)[
            :PAIRED_TERMS
        ]
        matched += [
            f"( {a} ) & ( {b} )"
            for a, b in itertools.combinations(rest, 2)
            if frequency[a] * frequency[b] / stats.n <= match_rows
        ]
    return Plan(kept, weights, left_out, matched, sum(weights))


def score(p: Plan, tsv: str = "e.tsv"):
    """The SQL (psycopg.sql) of the BM25 score of the row whose tsvector is `tsv`, for plan p's terms."""
    from psycopg import sql

    column = sql.SQL(tsv)
    terms = (
        sql.SQL(" + ").join(
            sql.SQL(TERM).format(
                tsv=column, term=sql.Placeholder(f"t{i}"), weight=sql.Placeholder(f"w{i}")
            )
            for i in range(len(p.terms))
        )
        if p.terms
        else sql.SQL("0")
    )
    return sql.SQL(SCORE).format(terms=terms, tsv=column)


def parameters(p: Plan, stats: TermStats, k1: float, b: float) -> dict:
    """The named parameters of score(p)."""
    values: dict[str, Any] = {"k1": k1, "b": b, "avgdl": stats.avgdl}
    for i, (term, weight) in enumerate(zip(p.terms, p.weights)):
        values[f"t{i}"], values[f"w{i}"] = term, weight
    return values
