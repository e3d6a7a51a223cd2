"""BM25 ranking of the text half, from term statistics PostgreSQL already keeps.

    score(e) = sum over the query terms t that e contains of idf(t)
               * (k1 + 1) / (1 + k1 * (1 - b + b * |e| / avg |e|))
    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

Term frequency counts as 1: memories are short, a word rarely repeats in one,
and repeating it does not make a memory more relevant. |e| is the number of
distinct lexemes of the episode's tsvector (`length(tsv)`), so no text is read.

Document frequencies cost nothing on write. ANALYZE (run by autovacuum) keeps
the most common lexemes of `episodes.tsv` with their frequencies in
`pg_stats.most_common_elems`; a term not among them is rare by definition and
is counted exactly through the GIN index, at the price of its few rows. A term
in more than `common_terms` of all episodes (and in more than
COMMON_MIN_ROWS of them) is left out of the match when the vector half runs:
its idf is small, so it barely ranks, and matching it is what made the text
half slow (every row holding it had to be ranked).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

COMMON_MIN_ROWS = 1000  # below this many rows, matching a word is cheap whatever its share
SAMPLE_ROWS = 2000  # episodes sampled for the average length

STATS = """
SELECT c.reltuples::float8 AS reltuples, s.most_common_elems::text::text[] AS lexemes,
       s.most_common_elem_freqs AS freqs
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'tsv'
WHERE c.oid = 'episodes'::regclass
"""
COUNT_ALL = "SELECT count(*)::float8 AS n FROM episodes"
AVERAGE_LENGTH = "SELECT avg(length(tsv))::float8 AS avgdl FROM episodes TABLESAMPLE SYSTEM (%s)"
COUNT_TERMS = """
SELECT t.ord, (SELECT count(*) FROM episodes e WHERE e.tsv @@ t.q::tsquery)::float8 AS df
FROM unnest(%s::text[]) WITH ORDINALITY AS t(q, ord) ORDER BY t.ord
"""
# The score of one episode (alias e) for the terms and weights given as parameters.
SCORE = """(SELECT coalesce(sum(t.idf), 0) FROM unnest(%(terms)s::tsquery[], %(idf)s::float8[]) AS t(q, idf)
  WHERE {tsv} @@ t.q) * (%(k1)s::float8 + 1)
  / (1 + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * length({tsv}) / %(avgdl)s::float8))"""

_LEXEME = re.compile(r"'((?:[^']|'')*)'")


@dataclass
class TermStats:
    """Episode count, average length and the most common lexemes' frequencies; df cache."""

    n: float
    avgdl: float
    common: dict[str, float]
    counted: dict[str, float] = field(default_factory=dict)


def term_stats(conn) -> TermStats:
    row = conn.execute(STATS).fetchone()
    n = row["reltuples"]
    if n is None or n < 0:  # never vacuumed or analyzed: count once
        n = conn.execute(COUNT_ALL).fetchone()["n"]
    common = dict(zip(row["lexemes"] or [], row["freqs"] or []))
    percent = 100.0 if n <= SAMPLE_ROWS else max(0.01, 100.0 * SAMPLE_ROWS / n)
    avgdl = conn.execute(AVERAGE_LENGTH, (percent,)).fetchone()["avgdl"]
    return TermStats(n=max(n, 1.0), avgdl=avgdl or 1.0, common=common)


def single_lexeme(tsquery: str) -> str | None:
    """'deploy' -> deploy; None for a phrase or several lexemes."""
    match = _LEXEME.fullmatch(tsquery.strip())
    return match.group(1).replace("''", "'") if match else None


def document_frequencies(conn, stats: TermStats, terms: list[str]) -> list[float]:
    """df of each term (a tsquery text): from the statistics when common, else counted."""
    wanted = [t for t in dict.fromkeys(terms) if t not in stats.counted and single_lexeme(t) not in stats.common]
    if wanted:
        for row in conn.execute(COUNT_TERMS, (wanted,), prepare=False).fetchall():
            stats.counted[wanted[row["ord"] - 1]] = row["df"]
    out = []
    for t in terms:
        lexeme = single_lexeme(t)
        out.append(stats.counted[t] if t in stats.counted else stats.common[lexeme] * stats.n)
    return out


def idf(n: float, df: float) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


@dataclass
class Plan:
    """What the text half matches and how it weighs each term."""

    terms: list[str]  # tsquery texts, one per wanted word or phrase kept
    weights: list[float]  # their idf
    left_out: list[str]  # wanted terms too common to match


def plan(conn, stats: TermStats, wanted: list[str], *, common_share: float | None) -> Plan:
    """Weigh the wanted terms; with common_share, leave out those in more than that share of episodes."""
    terms = list(dict.fromkeys(t for t in wanted if t))
    dfs = document_frequencies(conn, stats, terms)
    kept, weights, left_out = [], [], []
    for term, df in zip(terms, dfs):
        if df == 0:
            continue
        if common_share is not None and df > common_share * stats.n and df > COMMON_MIN_ROWS:
            left_out.append(term)
            continue
        kept.append(term)
        weights.append(idf(stats.n, df))
    return Plan(kept, weights, left_out)


def parameters(p: Plan, stats: TermStats, k1: float, b: float) -> dict:
    return {"terms": p.terms, "idf": p.weights, "k1": k1, "b": b, "avgdl": stats.avgdl}
