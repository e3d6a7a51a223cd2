"""What one search asks: Query (and a line of `episode search --batch`), the query syntax, the [search] settings.

The syntax is websearch's: words and "quoted phrases", each wanted (any of them finds an episode) or
-excluded; `match_query` turns their tsquery texts into the one tsquery the text half matches. An
unquoted wanted word also matches its SYNONYMS; a query with no wanted word is `unsearchable`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from memctl.config import Settings
from memctl.errors import BadValue, UsageError
from memctl.records import filters as episode_filters
from memctl.write import values

MODES = ("hybrid", "vector", "text")


@dataclass
class Query:
    text: str
    k: int = 5
    agent: str | None = None
    kind: str | None = None
    source: str | None = None
    since: str | None = None
    mode: str = "hybrid"
    until: str | None = None  # memctl.records.filters.UNTIL

    def check(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise UsageError("the query is empty")
        if "\x00" in self.text:
            raise UsageError("the query contains a NUL character")
        for name in ("agent", "kind", "source", "since", "until"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, str) or not value.strip() or "\x00" in value
            ):
                raise BadValue(
                    f"{name}: must be a non-empty string without NUL, got {type(value).__name__}",
                    name,
                )
        episode_filters.check_period(self.since, self.until)
        for name in ("text", "agent", "kind", "source"):
            values.utf8(getattr(self, name), "query" if name == "text" else name, BadValue)
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= MAX_K:
            raise UsageError(f"k must be an integer from 1 to {MAX_K}, got {self.k!r}")


MAX_K = 1000
BATCH_FIELDS = ("query", "agent", "k", "kind", "source", "since", "until", "mode")


def check_strings(
    item: dict, names, bad: Callable[[str, str], Exception], shown: Callable[[Any], str]
) -> None:
    """A batch line's text fields, those of NAMES it has: each a non-empty string without NUL, valid UTF-8;
    the first that is not raises bad(name, why)."""
    for name in (n for n in names if n in item):
        value = item[name]
        if not isinstance(value, str) or not value.strip():
            raise bad(name, f"must be a non-empty string, got {shown(value)}")
        if "\x00" in value:
            raise bad(name, "contains a NUL character (\\0)")
        try:
            values.utf8(value, name, BadValue)
        except BadValue:
            raise bad(name, "is not valid UTF-8 text (a lone surrogate)") from None


def batch_query(item: dict, number: int) -> Query:
    """One line of `episode search --batch`, every field checked where it enters.

    A field given must hold its type (leave it out for the default): query a non-empty string, k an
    integer from 1 to MAX_K (not "3", not 2.5, not true), agent/kind/source strings without NUL, since a
    duration or ISO 8601 date/time, mode one of MODES. BadValue names the line and the field.
    """

    def bad(name: str, why: str) -> BadValue:
        return BadValue(f"line {number}: field {name}: {why}", name)

    def shown(value: Any) -> str:
        text = json.dumps(value, default=str)
        return text if len(text) <= 60 else text[:57] + "..."

    check_strings(item, ("query", "agent", "kind", "source", "since", "until", "mode"), bad, shown)
    k = item.get("k", 5)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise bad("k", f"must be an integer from 1 to {MAX_K}, got {shown(k)}")
    mode = item.get("mode", "hybrid")
    if mode not in MODES:
        raise bad("mode", f"must be one of {', '.join(MODES)}, got {shown(mode)}")
    for name in ("since", "until"):
        if name in item:
            try:
                episode_filters.moment(item[name])
            except ValueError as exc:
                raise bad(name, str(exc)) from None
    return Query(
        item["query"],
        k=k,
        agent=item.get("agent"),
        kind=item.get("kind"),
        source=item.get("source"),
        since=item.get("since"),
        until=item.get("until"),
        mode=mode,
    )


@dataclass
class Terms:
    """A query split the way websearch syntax reads it: words and "phrases", each wanted or -excluded."""

    wanted: list[str]
    excluded: list[str]
    quoted: list[bool] = field(
        default_factory=list
    )  # per wanted piece: written in quotes (taken literally)


_TERM = re.compile(r'(-?)"([^"]*)"?|(\S+)')


def split_terms(text: str) -> Terms:
    """`deploy -nginx "disk full" -"dry run"`: wanted deploy and the phrase, excluded nginx and the phrase.

    A lone `-` or a word like `api-v2` is not a negation (only a leading dash is), and
    `or` is just a word: OR is already how wanted terms combine.
    """
    wanted: list[tuple[str, bool]] = []
    excluded: list[tuple[str, bool]] = []
    for match in _TERM.finditer(text):
        negated, phrase, word = match.group(1), match.group(2), match.group(3)
        if phrase is not None:
            (excluded if negated else wanted).append((phrase, True))
        elif word.startswith("-") and len(word) > 1:
            excluded.append((word[1:], False))
        else:
            wanted.append((word, False))
    kept = [(t, q) for t, q in wanted if t.strip()]
    return Terms([t for t, _ in kept], [t for t, _ in excluded if t.strip()], [q for _, q in kept])


# Words operators use for one thing, so that a question in one finds a memory written in another
# ("why did the release break" finds "deploy ... failed"): a wanted, unquoted word of a group also
# matches the others, in the text half only (a -word or a "quoted" word stays literal). Each group
# counts as one term of the query, its document frequency the sum of its words'. Kept to words
# without a common second meaning in an operations log.
SYNONYMS = (
    "deploy deploys deployed deploying deployment deployments release releases released releasing rollout rollouts",
    "fail fails failed failing failure failures break breaks broke broken breakage crash crashes crashed crashing "
    "outage outages",
    "restart restarts restarted restarting reboot reboots rebooted rebooting",
    "rollback rollbacks revert reverts reverted reverting",
    "slow slower slowness slowdown latency",
    "cert certs certificate certificates",
    "db dbs database databases",
    "postgres postgresql pg",
    "password passwords passphrase credential credentials",
    "alert alerts alerted alarm alarms",
    "disk disks storage",
    "delete deletes deleted deleting remove removes removed removing purge purged",
    "upgrade upgrades upgraded upgrading update updates updated",
    "error errors exception exceptions",
    "hang hangs hung stuck unresponsive frozen",
    "k8s kubernetes",
    "config configs configuration configurations",
    "backup backups snapshot snapshots",
    "network networking connectivity",
    "login logins logon signin",
    "repo repos repository repositories",
    "env environment environments",
    "prod production",
    "auth authentication",
    "hotfix hotfixes patch patches patched",
    "vuln vulns vulnerability vulnerabilities cve",
)
_SYNONYM_OF = {word: group.split() for group in SYNONYMS for word in group.split()}


def synonyms(piece: str) -> list[str]:
    """The other words of the piece's SYNONYMS group ([] for a phrase or a word of none)."""
    word = piece.strip(".,;:!?()[]'").lower()
    return [w for w in _SYNONYM_OF.get(word, []) if w != word]


NO_WORD = "the query has no word to search for (only punctuation or symbols): nothing searched"
ONLY_EXCLUDED = "the query only excludes (-word) and names no word to look for: nothing searched"


def unsearchable(text: str) -> str | None:
    """Why the query finds nothing whatever is stored (NO_WORD, ONLY_EXCLUDED), or None when it has a word.

    A wanted piece needs a letter or digit: `!!!`, `"`, `--` or `?!` would otherwise embed as noise,
    and noise has a nearest episode, which search would return as the best match.
    """
    terms = split_terms(text)
    if any(any(ch.isalnum() for ch in piece) for piece in terms.wanted):
        return None
    return ONLY_EXCLUDED if any(any(ch.isalnum() for ch in p) for p in terms.excluded) else NO_WORD


def match_query(wanted: list[str], excluded: list[str]) -> str | None:
    """`(w1 | w2 | 'disk' <-> 'full') & !'nginx' & !('dry' <-> 'run')`; None without a wanted piece."""
    kept = [f"( {q} )" for q in wanted if q]
    if not kept:
        return None  # only stopwords or only exclusions: nothing, rather than everything
    return " & ".join(["( " + " | ".join(kept) + " )", *(f"!( {q} )" for q in excluded if q)])


def context_kinds(settings: Settings) -> list[str]:
    return [k.strip() for k in str(settings.search.context_kinds).split(",") if k.strip()]
