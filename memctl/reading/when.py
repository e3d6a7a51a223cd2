"""The period a query names ("in July 2022", "on 1 May, 2022", "2022-05-01"), for the time term of scoring.

A question about a moment ("what did she watch on 1 May, 2022?", "what broke on 2026-11-30?") is
answered by what was written then, or soon after: an event is told after it happens ("last night",
"last week"). `period` finds the most precise date the query spells out (a day, else a month, else
"in 2022"), or the span between two ("between August 11 and August 15 2023", "from 2026-11-28 to
2026-11-30", "from May to July 2022": the first date takes what it leaves out from the second);
`closeness` is 1 for an episode created in that period (or a first whose repeats were seen in it),
falling linearly to 0 over the period's telling time after it (a week after a day, two after a month
or a year), and 0 before it.
Relative words ("yesterday", "last week") are not read: the query's own moment is not the episodes'.
Days, months and years are UTC's, as a time without a zone is everywhere in memctl (values.parse_time).
"""

from __future__ import annotations

import calendar
import datetime
import re
from dataclasses import dataclass

_MONTH_NAMES = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES, 1)}
MONTHS.update({name[:3]: i for name, i in list(MONTHS.items())})
MONTHS["sept"] = 9
_MONTH = "(" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
# a year ends the date: not a version or a number going on ("2022.3", "2022/7", "20221")
_END = r"(?!\w|[.,/:-]\d)"
# an ISO date stands alone: not inside a ticket or a name ("INC-2024-05", "v2024-05-01"); a time may follow
_ALONE = r"(?<![\w-])"

# most precise first; each a (pattern, what its groups are)
_PATTERNS = [
    (re.compile(_ALONE + _YEAR + r"-(\d\d)-(\d\d)(?![\d-])"), "ymd"),
    (re.compile(r"\b" + _DAY + r"\s+(?:of\s+)?" + _MONTH + r",?\s+" + _YEAR + _END, re.I), "dmy"),
    (re.compile(r"\b" + _MONTH + r"\s+" + _DAY + r",?\s+" + _YEAR + _END, re.I), "mdy"),
    (re.compile(_ALONE + _YEAR + r"-(\d\d)(?![\w-])"), "ym"),
    (re.compile(r"\b" + _MONTH + r",?\s+(?:of\s+)?" + _YEAR + _END, re.I), "my"),
    (re.compile(r"\b(?:in|during|throughout|of)\s+" + _YEAR + _END, re.I), "y"),
]
TELLING = {
    "day": datetime.timedelta(days=7),
    "month": datetime.timedelta(days=14),
    "year": datetime.timedelta(days=14),
}


@dataclass(frozen=True)
class Period:
    start: datetime.datetime
    end: datetime.datetime  # exclusive
    telling: datetime.timedelta  # how long after the end an episode may still tell of it

    def closeness(
        self, when: datetime.datetime, last_seen: datetime.datetime | None = None
    ) -> float:
        """1 inside the period, falling to 0 over `telling` after it; 0 before it. `last_seen`: the end of
        the span a repeated episode was seen in (its first's time to its latest repeat's), 1 when that span
        reaches into the period."""
        if last_seen is not None and last_seen >= self.start and when < self.end:
            return 1.0
        if when < self.start:
            return 0.0
        if when < self.end:
            return 1.0
        late = (when - self.end) / self.telling
        return max(0.0, 1.0 - late)


def _date(
    year: int, month: int, day: int | None
) -> tuple[datetime.datetime, datetime.datetime] | None:
    if not 1 <= month <= 12:
        return None
    if day is None:
        start = datetime.datetime(year, month, 1, tzinfo=datetime.timezone.utc)
        days = calendar.monthrange(year, month)[1]
        return start, start + datetime.timedelta(days=days)
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        return None
    start = datetime.datetime(year, month, day, tzinfo=datetime.timezone.utc)
    return start, start + datetime.timedelta(days=1)


# a span's first date, read back from its second: "between <first> and ", "from <first> to "
_SPAN_OPEN = re.compile(
    r"\b(?:between|from)\s+((?:(?!\b(?:between|from)\b).){1,40}?),?\s+"
    r"(?:and|to|until|till|through|thru)\s+(?:the\s+)?$",
    re.I,
)
# how far before a date its span's opening can start ("between ", 40 characters, ", through the "): reading
# further back finds nothing more, and would cost a search over the whole text per date (26 s for 5,000 dates)
_SPAN_REACH = 80
_FIRST = [  # what the first date may leave out, taken from the second: (pattern, its groups)
    (re.compile(_MONTH + r"\s+" + _DAY, re.I), "md"),
    (re.compile(_DAY + r"\s+(?:of\s+)?" + _MONTH, re.I), "dm"),
    (re.compile(_DAY, re.I), "d"),
    (re.compile(_MONTH, re.I), "m"),
    (re.compile(_YEAR), "y"),
]
# a span of years needs no "in": "between 2021 and 2023"
_YEARS = re.compile(
    r"\b(?:between|from)\s+" + _YEAR + r"\s+(?:and|to|until|till|through|thru)\s+" + _YEAR + _END,
    re.I,
)


def _span(
    shape: str, g: tuple
) -> tuple[tuple[datetime.datetime, datetime.datetime] | None, str, tuple]:
    """A matched date's span, its unit and its (year, month, day) (month and day None where not named)."""
    if shape == "ymd":
        ymd: tuple[int, int, int | None] = int(g[0]), int(g[1]), int(g[2])
    elif shape == "dmy":
        ymd = int(g[2]), MONTHS[g[1].lower()], int(g[0])
    elif shape == "mdy":
        ymd = int(g[2]), MONTHS[g[0].lower()], int(g[1])
    elif shape == "ym":
        ymd = int(g[0]), int(g[1]), None
    elif shape == "my":
        ymd = int(g[1]), MONTHS[g[0].lower()], None
    else:
        year = int(g[0])
        return (
            (
                datetime.datetime(year, 1, 1, tzinfo=datetime.timezone.utc),
                datetime.datetime(year + 1, 1, 1, tzinfo=datetime.timezone.utc),
            ),
            "year",
            (year, None, None),
        )
    return _date(*ymd), "day" if ymd[2] is not None else "month", ymd


def _first(text: str, last: tuple) -> tuple[datetime.datetime | None, bool]:
    """The start of a span's first date, `text`, completed by its last date's (year, month, day), and
    whether it took the last's year alone (a first date after the last then means the year before:
    "between December 30 and January 2 2023"; a bare day took the month too, and is no such case)."""
    text = re.sub(r"^the\s+", "", text.strip(), flags=re.I)
    for pattern, shape in _PATTERNS:
        if shape != "y" and (m := pattern.fullmatch(text)):
            span = _span(shape, m.groups())[0]
            return (span[0] if span else None), False
    year, month, _ = last
    for pattern, shape in _FIRST:
        if not (m := pattern.fullmatch(text)):
            continue
        g = m.groups()
        if shape == "md":
            span = _date(year, MONTHS[g[0].lower()], int(g[1]))
        elif shape == "dm":
            span = _date(year, MONTHS[g[1].lower()], int(g[0]))
        elif shape == "d":
            span = _date(year, month, int(g[0])) if month is not None else None
            return (span[0] if span else None), False
        elif shape == "m":
            span = _date(year, MONTHS[g[0].lower()], None)
        else:
            january = _date(int(g[0]), 1, None)
            assert january is not None  # a month without a day: a span, or ValueError
            return january[0], False
        return (span[0] if span else None), True
    return None, False


def period(text: str) -> Period | None:
    """The span between two dates `text` names, else the most precise period it spells out with a
    year, or None."""
    spanned = _between(text)
    if spanned is not None:
        return spanned
    for pattern, shape in _PATTERNS:
        for m in pattern.finditer(text):
            span, unit, _ = _span(shape, m.groups())
            if span is not None:
                return Period(span[0], span[1], TELLING[unit])
    return None


def _between(text: str) -> Period | None:
    """ "between <first> and <last>", "from <first> to <last>": from the first's start to the last's end."""
    if m := _YEARS.search(text):
        first, last = int(m.group(1)), int(m.group(2))
        if first < last:
            return Period(
                datetime.datetime(first, 1, 1, tzinfo=datetime.timezone.utc),
                datetime.datetime(last + 1, 1, 1, tzinfo=datetime.timezone.utc),
                TELLING["year"],
            )
    for pattern, shape in _PATTERNS:
        for m in pattern.finditer(text):
            opening = _SPAN_OPEN.search(text, max(0, m.start() - _SPAN_REACH), m.start())
            if opening is None:
                continue
            span, unit, ymd = _span(shape, m.groups())
            if span is None:
                continue
            start, took_year = _first(opening.group(1), ymd)
            if (
                start is not None and start >= span[1] and took_year
            ):  # "between December 30 and January 2 2023"
                start, _ = _first(opening.group(1), (ymd[0] - 1, *ymd[1:]))
            if start is not None and start < span[1]:
                return Period(start, span[1], TELLING[unit])
    return None
