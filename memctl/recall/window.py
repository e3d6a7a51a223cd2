"""Windows around what is found: each hit's neighbours in time, merged where windows meet.

In a conversation or a log the answer is often beside what matched: the reply after the question,
the resolution after the alert, the line before the error. A hit's window is the entries just
before and after it in its agent's log (by id, the order they were written), of the same source
(NULL with NULL), each within `gap` of the entry next to it towards the hit; a repeat row is never
a neighbour (its first stands for it, docs/repeats.md), and with `until` only entries created
before it count. At most `before` and `after` of them; the walk reads at most SCAN rows a side,
so an agent's log full of other sources' entries costs a bounded read.

Recall (memctl.recall.recall) then spends its budget on hits and neighbours in one order
(`plan`): the hit of rank r (0 for the best) comes at r, its neighbour d entries away at r + d x
`stride`; so a neighbour earns its tokens before the next hit when stride < 1, after the next
`stride` hits otherwise. Chosen entries that are neighbours in a window join one block, printed
in time order with each hit marked (`Block`). With `group` (the default), hits whose heading would say the
same (agent, source, age) are linked too (`grouped`): one block, the heading said once. The rule and the
figures it rests on: docs/recall.md.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from memctl.config import parse_duration

if TYPE_CHECKING:
    from memctl.db.memory import Memory

SCAN = 4  # rows read a side per neighbour wanted: a bounded walk through other sources' entries
MAX_SIDE = 10  # at most this many neighbours a side ([recall] window_before/after, --context)

# The entries around each hit, read by the primary key (agent, id), both sides in one statement.
NEIGHBOURS = """
SELECT h.id AS hit, n.side, n.id, n.agent, n.kind, n.source, n.importance, n.created_at, n.content,
       n.repeat_of IS NOT NULL AS is_repeat
FROM unnest(%(ids)s::bigint[]) AS h(id)
CROSS JOIN LATERAL (
    (SELECT -1 AS side, e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content, e.repeat_of
     FROM episodes e WHERE e.agent = %(agent)s AND e.id < h.id AND e.created_at < %(until)s
     ORDER BY e.id DESC LIMIT %(scan)s)
    UNION ALL
    (SELECT 1, e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content, e.repeat_of
     FROM episodes e WHERE e.agent = %(agent)s AND e.id > h.id AND e.created_at < %(until)s
     ORDER BY e.id LIMIT %(scan)s)
) n
ORDER BY h.id, n.side, abs(n.id - h.id)
"""
FAR_FUTURE = datetime.datetime(9999, 1, 1, tzinfo=datetime.timezone.utc)


@dataclass(frozen=True)
class Rule:
    before: int = 0
    after: int = 0
    gap: float = 3600.0  # seconds between an entry and the next one towards the hit
    stride: float = 1.0
    group: bool = True  # hits with the same heading (agent, source, age) print as one block

    @property
    def off(self) -> bool:
        return self.before == 0 and self.after == 0


def rule(settings, before: int | None = None, after: int | None = None) -> Rule:
    """The [recall] window settings (before/after given here win: `episode search --context N`)."""
    conf = settings.recall
    return Rule(
        before=int(conf.window_before if before is None else before),
        after=int(conf.window_after if after is None else after),
        gap=float(parse_duration(conf.window_gap)),
        stride=float(conf.window_stride),
        group=bool(conf.group),
    )


@dataclass
class Entry:
    """One episode in a window: a hit (match) or a neighbour of one."""

    id: int
    agent: str
    kind: str
    source: str | None
    importance: int
    created_at: datetime.datetime
    content: str
    match: bool = False
    score: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # a hit's own fields (repeats, duplicates)

    @property
    def key(self) -> tuple[str, int]:
        return (self.agent, self.id)

    def order(self) -> tuple:
        return (self.created_at, self.id)


# hit key -> (neighbours before it, nearest first; neighbours after it, nearest first)
Windows = dict[tuple[str, int], tuple[list[Entry], list[Entry]]]


def windows(
    conn: Memory, hits: list[Entry], rule_: Rule, until: datetime.datetime | None = None
) -> Windows:
    """Each hit's neighbours by the rule, one statement per agent among the hits."""
    found: Windows = {h.key: ([], []) for h in hits}
    if rule_.off or not hits:
        return found
    by_agent: dict[str, list[Entry]] = {}
    for h in hits:
        by_agent.setdefault(h.agent, []).append(h)
    scan = SCAN * max(rule_.before, rule_.after) + SCAN
    for agent, mine in by_agent.items():
        params = {
            "ids": [h.id for h in mine],
            "agent": agent,
            "until": until or FAR_FUTURE,
            "scan": scan,
        }
        rows: dict[tuple[int, int], list[dict]] = {}
        for row in conn.execute(NEIGHBOURS, params):
            rows.setdefault((row["hit"], row["side"]), []).append(row)
        for h in mine:
            found[h.key] = (
                _walk(h, rows.get((h.id, -1), []), rule_.before, rule_.gap),
                _walk(h, rows.get((h.id, 1), []), rule_.after, rule_.gap),
            )
    return found


def _walk(hit: Entry, rows: list[dict], wanted: int, gap: float) -> list[Entry]:
    """The first `wanted` entries outward of the hit's source, each within gap of the one before."""
    kept: list[Entry] = []
    last = hit.created_at
    for row in rows:
        if len(kept) >= wanted:
            break
        if row["is_repeat"] or row["source"] != hit.source:
            continue
        if abs((row["created_at"] - last).total_seconds()) > gap:
            break
        kept.append(
            Entry(
                row["id"],
                row["agent"],
                row["kind"],
                row["source"],
                row["importance"],
                row["created_at"],
                row["content"],
            )
        )
        last = row["created_at"]
    return kept


@dataclass
class Unit:
    """A hit or a neighbour, in the order the budget takes them."""

    priority: float
    rank: int  # its hit's rank
    entry: Entry


def plan(hits: list[Entry], found: Windows, rule_: Rule) -> list[Unit]:
    """Hits and neighbours in the order recall spends its budget: hit r at r, neighbour d at r + d x stride."""
    units = []
    by_key = {h.key: h for h in hits}  # a neighbour that is itself a hit comes as the hit (marked)
    for rank, h in enumerate(hits):
        units.append(Unit(float(rank), rank, h))
        before, after = found.get(h.key, ([], []))
        for side in (after, before):  # after first on a tie: a reply answers what came before it
            for d, entry in enumerate(side, 1):
                units.append(Unit(rank + d * rule_.stride, rank, by_key.get(entry.key, entry)))
    return sorted(units, key=lambda u: (u.priority, u.rank, u.entry.match is False))


def links(hits: list[Entry], found: Windows) -> dict[tuple[str, int], set[tuple[str, int]]]:
    """Entry key -> the keys of the entries next to it in some window."""
    linked: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for h in hits:
        before, after = found.get(h.key, ([], []))
        run = [*reversed(before), h, *after]
        for a, b in zip(run, run[1:]):  # by key: a neighbour that is a hit links as the hit
            linked.setdefault(a.key, set()).add(b.key)
            linked.setdefault(b.key, set()).add(a.key)
    return linked


def grouped(
    hits: list[Entry],
    linked: dict[tuple[str, int], set[tuple[str, int]]],
    heading: Callable[[Entry], tuple | None],
) -> dict[tuple[str, int], set[tuple[str, int]]]:
    """`linked` with each hit also linked to the best hit of the same heading (None: never grouped), so
    the hits one heading would say the same of join one block under it: the heading said once, not a line."""
    first: dict[tuple, Entry] = {}
    for h in hits:  # best first
        head = heading(h)
        if head is None:
            continue
        leader = first.setdefault(head, h)
        if leader is not h:
            linked.setdefault(h.key, set()).add(leader.key)
            linked.setdefault(leader.key, set()).add(h.key)
    return linked


@dataclass
class Block:
    """Chosen entries that are neighbours, in time order once added (Blocks.trial's: not yet); `rank`: its
    best hit's."""

    entries: list[Entry]
    rank: int

    @property
    def first(self) -> Entry:
        return min(self.entries, key=Entry.order)

    @property
    def matches(self) -> list[Entry]:
        return [e for e in self.entries if e.match]


class Blocks:
    """The chosen entries, grouped into blocks as they are added (windows that meet merge)."""

    def __init__(
        self, linked: dict[tuple[str, int], set[tuple[str, int]]], cost: Callable[[Block], int]
    ):
        self.linked, self.cost = linked, cost
        self.block_of: dict[tuple[str, int], Block] = {}
        self.blocks: list[Block] = []

    def has(self, entry: Entry) -> bool:
        return entry.key in self.block_of

    def trial(self, entry: Entry, rank: int) -> tuple[Block, list[Block], int]:
        """The block `entry` would make, the blocks it would replace, and the tokens that adds."""
        joined: list[Block] = []
        for key in self.linked.get(entry.key, ()):
            block = self.block_of.get(key)
            if block is not None and not any(block is j for j in joined):
                joined.append(block)
        entries = [
            entry,
            *(e for b in joined for e in b.entries),
        ]  # in time order when added (Blocks.add)
        new = Block(entries, min([rank, *(b.rank for b in joined)]))
        if not joined and not entry.match:
            return new, joined, 0  # a neighbour cut off from its hit: never added (Spend)
        return new, joined, self.cost(new) - sum(self.cost(b) for b in joined)

    def add(self, new: Block, joined: list[Block]) -> None:
        new.entries.sort(key=Entry.order)
        self.blocks = [b for b in self.blocks if not any(b is j for j in joined)] + [new]
        for e in new.entries:
            self.block_of[e.key] = new

    def ordered(self) -> list[Block]:
        return sorted(self.blocks, key=lambda b: b.rank)


def around(
    conn: Memory, hits: list, width: int, until: datetime.datetime | None = None
) -> list[dict]:
    """`episode search --context N`: the hits (fusion.Hit) with `width` neighbours each side by the window
    rule ([recall] window_gap), as rows in blocks (windows that meet merged), each block in time order;
    `block` numbers them from 1 in the order of their best hit, `match` marks the hits (a neighbour's
    score and ranks are None)."""
    settings = conn.settings
    entries = [
        Entry(
            h.id,
            h.agent,
            h.kind,
            h.source,
            h.importance,
            h.created_at,
            h.content,
            match=True,
            score=h.score,
            extra={"hit": h},
        )
        for h in hits
    ]
    width = max(0, min(int(width), MAX_SIDE))
    found = windows(conn, entries, rule(settings, before=width, after=width), until)
    blocks = Blocks(links(entries, found), lambda block: 0)
    for unit in plan(entries, found, Rule(width, width, 0.0, 1.0)):
        if not blocks.has(unit.entry):
            new, joined, _ = blocks.trial(unit.entry, unit.rank)
            blocks.add(new, joined)
    rows = []
    for number, block in enumerate(blocks.ordered(), 1):
        for e in block.entries:
            if e.match:
                row = e.extra["hit"].to_dict()
            else:
                row = {key: None for key in (entries[0].extra["hit"].to_dict() if entries else {})}
                row.update(
                    id=e.id,
                    agent=e.agent,
                    kind=e.kind,
                    source=e.source,
                    importance=e.importance,
                    created_at=e.created_at,
                    content=e.content,
                )
            rows.append({**row, "match": e.match, "block": number})
    return rows


def episode_search(
    conn: Memory, query, *, track: bool = True, context: int = 0, every: bool = False
) -> tuple[Any, list[dict]]:
    """`memctl episode search`: the search's outcome (memctl.reading.search.Outcome) and the rows
    it prints: each hit, with every repeat of it after it (`every`: search.with_repeats), or with
    `context` neighbours a side in blocks (around); UsageError for both."""
    from memctl.errors import UsageError
    from memctl.reading import search

    if context and every:
        raise UsageError("--context and --all: choose one")
    outcome = search.search(conn, query, track=track)
    if context:
        rows = around(conn, outcome.hits, context)
    elif every:
        rows = search.with_repeats(conn, outcome.hits)
    else:
        rows = [hit.to_dict() for hit in outcome.hits]
    return outcome, rows
