"""The first statement of a query: its pieces (words, "phrases", -exclusions) parsed as PostgreSQL
parses episodes, and its rare words counted.

A query's pieces become tsquery texts by PostgreSQL's english configuration, each the way
episodes.tsv holds it; the same statement counts the document frequency of every wanted word that
is not among the statistics' common lexemes (memctl.reading.bm25) and, for the context kinds, says
whether any episode of them is within the query's reach. pieces() runs it; pieces_call() hands it
to a batch's pipeline (memctl.reading.search) with the reading of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memctl.reading import bm25
from memctl.reading.query import Query, Terms, split_terms, synonyms
from memctl.reading.statement import StatementCall
from memctl.records import filters as episode_filters

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# Each piece of the query (a word, a "quoted phrase") becomes its own tsquery text: lexemes as
# PostgreSQL's english configuration makes them, phrases with <->, and / . : @ read as spaces, as
# episodes.tsv reads them (sql/0013): '/var/log/nginx' is 'var' <-> 'log' <-> 'nginx', which an
# episode naming that path holds, and so is nginx alone (found, or excluded by -nginx).
PIECES = """
SELECT p.ord, phraseto_tsquery('english', translate(p.piece, '/.:@', '    '))::text AS q
FROM unnest(%s::text[]) WITH ORDINALITY AS p(piece, ord) ORDER BY p.ord
"""
PIECES_PROBED = """
SELECT p.ord, phraseto_tsquery('english', translate(p.piece, '/.:@', '    '))::text AS q,
       false AS rare, 0::float8 AS df, {probe} AS context
FROM unnest(%(pieces)s::text[]) WITH ORDINALITY AS p(piece, ord) ORDER BY p.ord
"""
# Whether any episode the query could reach is of a context kind: without one, the query's statement
# leaves the neighbours out (they cost a third of its planning).
# The kinds are the configuration's, written into the statement so that its prepared (generic) plan
# still knows how rare they are and probes episodes_kind_created_idx rather than scanning.
PROBE = "EXISTS (SELECT 1 FROM episodes e WHERE e.kind = ANY({kinds}) {filters})"
# The same, with the document frequency of each wanted piece and synonym (after the excluded pieces)
# that is not a common lexeme (those come from the statistics): one GIN scan per rare piece, joined
# rather than a correlated subquery, so Citus can plan it too (the tsqueries stay text inside: Citus
# ships a CTE's rows to the workers as text, and the empty tsquery of a stopword does not read back).
# Scoped to one agent (on Citus, so that the count runs on its shard alone), pieces() scales the
# counts by the agent's share to the whole table's, which the common lexemes' frequencies are of.
PIECES_COUNTED = """
WITH p AS MATERIALIZED (
    SELECT p.ord, phraseto_tsquery('english', translate(p.piece, '/.:@', '    '))::text AS q
    FROM unnest(%(pieces)s::text[]) WITH ORDINALITY AS p(piece, ord)
),
rare AS MATERIALIZED (
    SELECT DISTINCT ON (q) ord, q FROM p  -- a synonym may parse to a wanted piece's lexeme: counted once
    -- array_position, not q = ANY(common): the planner would estimate each of the thousand elements
    WHERE (ord <= %(wanted)s OR ord > %(plain)s) AND numnode(q::tsquery) > 0
      AND array_position(%(common)s::text[], q) IS NULL
),
counted AS (
    SELECT r.ord, count(*)::float8 AS df FROM rare r {episodes} {agent} GROUP BY r.ord
)
SELECT p.ord, p.q, r.ord IS NOT NULL AS rare, coalesce(c.df, 0) AS df, {probe} AS context
FROM p LEFT JOIN rare r USING (ord) LEFT JOIN counted c USING (ord)
ORDER BY p.ord
"""

# The episodes counted: by the text index, or in an agent's role (Memory.as_agent) by the ids it finds among
# the agent's episodes (bm25.MATCHED: memctl_agent_matches), read again under the table's policies.
COUNTED_EPISODES = "JOIN episodes e ON e.tsv @@ r.q::tsquery"
COUNTED_MATCHES = (
    "CROSS JOIN LATERAL (SELECT memctl_agent_matches(r.q::tsquery) AS ids OFFSET 0) m "
    "JOIN episodes e ON e.tsv @@ r.q::tsquery AND e.id = ANY(m.ids)"
)


@dataclass
class Parsed(Terms):
    context: bool = True  # an episode of a context kind is within the query's reach


@dataclass
class PiecesCall:
    """The statement of pieces() and what reading its rows needs."""

    request: StatementCall
    terms: Terms
    groups: list[list[str]]
    stats: bm25.TermStats | None
    counting: bool
    share: float = 1.0

    def answer(self, conn: Memory, rows: list[dict]) -> Parsed:
        """The pieces from the statement's rows; the rare words' counts go into stats.counted."""
        if self.counting:
            assert self.stats is not None  # counting: there are statistics to count into
            self.stats.counted.update(
                (r["q"], r["df"] / self.share if r["df"] and self.share > 0 else r["df"])
                for r in rows
                if r["rare"]
            )
        parsed = _grouped(
            conn,
            self.terms,
            self.groups,
            [r["q"] for r in rows],
            self.stats if self.terms.wanted else None,
        )
        if "context" in rows[0]:
            parsed.context = rows[0]["context"]
        return parsed


def pieces(
    conn: Memory,
    text: str,
    stats: bm25.TermStats | None = None,
    *,
    probe: tuple[list[str], Query] | None = None,
    scope: str | None = None,
) -> Parsed:
    """The query's wanted and excluded pieces as tsquery texts ('' for a piece of stopwords only).

    With `stats`, the same statement counts the wanted pieces' document frequencies into
    stats.counted (all but the common lexemes, which the statistics know): in the episodes of
    `scope` (an agent) when given, scaled by its share of the table.
    With `probe` (context kinds, query), it also says whether an episode of those kinds passes
    the query's agent and kind filters.
    """
    call = pieces_call(conn, text, stats, probe=probe, scope=scope)
    if isinstance(call, Parsed):
        return call
    r = call.request
    return call.answer(conn, conn.execute(r.text, r.params, prepare=r.prepare).fetchall())


def pieces_call(
    conn: Memory,
    text: str,
    stats: bm25.TermStats | None = None,
    *,
    probe: tuple[list[str], Query] | None = None,
    scope: str | None = None,
) -> PiecesCall | Parsed:
    """pieces() as a statement to run and the reading of its rows (PiecesCall.answer); the Parsed
    pieces at once when there is nothing to run (no word)."""
    terms = split_terms(text)
    # each unquoted wanted word's synonyms (query.SYNONYMS) are parsed and counted after the pieces
    groups = [[] if quoted else synonyms(word) for word, quoted in zip(terms.wanted, terms.quoted)]
    every = terms.wanted + terms.excluded
    plain = len(every)
    every += [word for group in groups for word in group]
    if not plain:
        return Parsed([], [])
    if stats is None and probe is None:
        return PiecesCall(
            StatementCall(PIECES, (every,), prepare=False), terms, groups, None, False
        )
    params: dict[str, Any] = {"pieces": every}
    counting = stats is not None and bool(terms.wanted)
    if probe is not None:
        params.update(episode_filters.filters(agent=probe[1].agent, kind=probe[1].kind)[1])
    share = 1.0
    if counting:
        assert stats is not None  # counting: there are statistics
        if scope is not None:
            share = bm25.agent_share(conn, stats, scope)
            params["agent"] = scope
        # the common lexemes as one literal made once per statistics (bm25.TermStats.common_array)
        params.update(wanted=len(terms.wanted), plain=plain, common=stats.common_array)
    shape = (
        tuple(probe[0]) if probe is not None else None,
        (probe[1].agent is not None, probe[1].kind is not None) if probe is not None else None,
        counting,
        counting and scope is not None,
        counting and conn.in_agent_role,
    )
    statement = _PIECES.get(shape)
    if statement is None:
        statement = _PIECES[shape] = _compose_pieces(probe, counting, scope, shape[-1]).as_bytes(
            None
        )
    # prepared once used a few times (psycopg's default)
    return PiecesCall(StatementCall(statement, params), terms, groups, stats, counting, share)


# pieces()' statements by their shape: the probe's kinds and filters, whether it counts, in an agent's episodes,
# in an agent's role
_PIECES: dict[tuple, bytes] = {}


def _compose_pieces(
    probe: tuple[list[str], Query] | None, counting: bool, scope: str | None, in_role: bool
):
    from psycopg import sql

    check: sql.Composable = sql.SQL("true")
    if probe is not None:
        kinds, query = probe
        clauses, _ = episode_filters.filters(agent=query.agent, kind=query.kind)
        check = sql.SQL(PROBE).format(
            kinds=sql.Literal(list(kinds)),
            filters=sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses),
        )
    if not counting:
        return sql.SQL(PIECES_PROBED).format(probe=check)
    within = (
        sql.SQL(" AND e.agent = {}").format(sql.Placeholder("agent"))
        if scope is not None
        else sql.SQL("")
    )
    return sql.SQL(PIECES_COUNTED).format(
        probe=check,
        agent=within,
        episodes=sql.SQL(COUNTED_MATCHES if in_role else COUNTED_EPISODES),
    )


def _grouped(
    conn: Memory,
    terms: Terms,
    groups: list[list[str]],
    parsed: list[str],
    stats: bm25.TermStats | None,
) -> Parsed:
    """The wanted pieces with their synonyms ORed in (document frequency: the sum of the words'), the excluded."""
    wanted = parsed[: len(terms.wanted)]
    plain = len(terms.wanted) + len(terms.excluded)
    extra = iter(parsed[plain:])
    for i, group in enumerate(groups):
        words = [q for q in dict.fromkeys([wanted[i], *(next(extra) for _ in group)]) if q]
        if len(words) < 2:
            continue
        wanted[i] = " | ".join(w if bm25.single_lexeme(w) else f"( {w} )" for w in words)
        if stats is not None:
            stats.counted[wanted[i]] = min(
                stats.n, sum(bm25.document_frequencies(conn, stats, words))
            )
    return Parsed(wanted, parsed[len(terms.wanted) : plain])
