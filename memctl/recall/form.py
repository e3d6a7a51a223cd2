"""Recall's block: the template and line formats ([recall] in the config), the items, and how a
window of episodes (memctl.recall.window) is printed.

An episode's line is `episode_line`; a window (a hit with neighbours, or hits whose windows met) is
`window_line` (fields: count, age, agent, kind, source, sourced) followed by its episodes in time
order, one a line, each indented, the ones that matched marked "> " (MATCH) and the others "  "
(BESIDE), as `{mark}{content}` with the content on one line. Near-duplicates folded into a hit
(recall's collapse) are named on its line by id (`folded`: " (near-duplicates: #12, #15)").
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from memctl.config import Settings
from memctl.errors import ConfigError

DEFAULT_TEMPLATE = "Relevant memory (facts are current; episodes are past events):\n{items}\n"
DEFAULT_LINES = {
    "fact": "- [fact] {key} = {value} (current fact{sourced})",
    "episode": "- [episode, {age}{sourced}] {content}{seen}{folded}",
    "window": "- [{count} episodes, {age}{sourced}, in time order; > matched]",
    "runbook": "- [runbook] {name}: {title}",
}
FIELDS = {
    "fact": (
        "key",
        "value",
        "source",
        "sourced",
        "namespace",
        "version",
        "valid_from",
        "age",
        "score",
    ),
    "episode": (
        "id",
        "agent",
        "kind",
        "source",
        "sourced",
        "importance",
        "created_at",
        "age",
        "content",
        "score",
        "repeats",
        "seen",
        "first_seen",
        "last_seen",
        "folded",
    ),
    "window": ("count", "age", "agent", "kind", "source", "sourced"),
    "runbook": ("name", "title", "score"),
}
MATCH, BESIDE = "  > ", "    "
# to check a line format's fields and specs
SAMPLE = {"score": 0.5, "id": 1, "importance": 5, "version": 1, "repeats": 0, "count": 2}


@dataclass
class Item:
    kind: str  # fact | episode | window | runbook
    score: float
    line: str  # a window's: its lines joined by newlines
    tokens: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "score": self.score,
            "tokens": self.tokens,
            "text": self.line,
            **self.data,
        }


# ---------------------------------------------------------------------------
# The template


@dataclass
class Template:
    header: str
    footer: str
    lines: dict[str, str]

    def line(self, kind: str, values: dict[str, Any]) -> str:
        return " ".join(
            self.lines[kind].format(**values).split()
        )  # one line per item, however the text ran


_ITEMS = "\x00items\x00"


def template(settings: Settings) -> Template:
    """The configured block and line formats, checked now so a typo fails loudly, not per item."""
    block = settings.recall.template or DEFAULT_TEMPLATE
    try:
        rendered = block.format(items=_ITEMS)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"[recall] template: {exc!r} (the only field is {{items}}; write {{{{ for a brace)"
        ) from None
    if rendered.count(_ITEMS) != 1:
        raise ConfigError("[recall] template: must contain {items} exactly once")
    header, footer = rendered.split(_ITEMS)
    lines = {}
    for kind, default in DEFAULT_LINES.items():
        text = getattr(settings.recall, f"{kind}_line") or default
        try:
            text.format(**{name: SAMPLE.get(name, "x") for name in FIELDS[kind]})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"[recall] {kind}_line: {exc!r}; fields: {', '.join(FIELDS[kind])}"
            ) from None
        lines[kind] = text
    return Template(header, footer, lines)


# ---------------------------------------------------------------------------
# Pieces


def age(then: datetime.datetime, now: datetime.datetime) -> str:
    """'just now', '1 minute ago', '3 days ago', '2 months ago', '4 years ago'."""
    seconds = (now - then).total_seconds()
    for unit, size in (
        ("year", 365 * 86400),
        ("month", 30 * 86400),
        ("day", 86400),
        ("hour", 3600),
        ("minute", 60),
    ):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'' if n == 1 else 's'} ago"
    return "just now"


def sourced(source: str | None) -> str:
    return f", source: {source}" if source else ""


def folded(duplicates: list[int]) -> str:
    """ " (near-duplicates: #12, #15)" for a hit others were folded into, else ""."""
    return f" (near-duplicates: {', '.join(f'#{i}' for i in duplicates)})" if duplicates else ""


def window_lines(form: Template, entries: list, now: datetime.datetime) -> list[str]:
    """A window's lines: its header, then its episodes in time order, the matches marked (without newlines)."""
    return [window_header(form, entries[0], len(entries), now), *(entry_line(e) for e in entries)]


def window_header(form: Template, first, count: int, now: datetime.datetime) -> str:
    """A window's first line, from its first episode and how many it holds."""
    return form.line(
        "window",
        {
            "count": count,
            "age": age(first.created_at, now),
            "agent": first.agent,
            "kind": first.kind,
            "source": first.source,
            "sourced": sourced(first.source),
        },
    )


def entry_line(entry) -> str:
    """One episode of a window: marked when it matched, its text on one line (a match's folded ids after it)."""
    text = " ".join(entry.content.split())
    if entry.match:
        return MATCH + text + folded(entry.extra.get("duplicates") or [])
    return BESIDE + text
