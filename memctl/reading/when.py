"""The period a query names ("in July 2022", "on 1 May, 2022", "2022-05-01"), for the time term of scoring.

A question about a moment ("what did she watch on 1 May, 2022?", "what broke on 2026-11-30?") is
answered by what was written then, or soon after: an event is told after it happens ("last night",
"last week"). `period` finds the most precise date the query spells out (a day, else a month, else
"in 2022"); `closeness` is 1 for an episode created in that period, falling linearly to 0 over the
period's telling time after it (a week after a day, two after a month or a year), and 0 before it.
Relative words ("yesterday", "last week") are not read: the query's own moment is not the episodes'.
Days, months and years are UTC's, as a time without a zone is everywhere in memctl (values.parse_time).
"""

from __future__ import annotations

import calendar
import datetime
import re
from dataclasses import dataclass

_MONTH_NAMES = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
                "october", "november", "december"]
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
TELLING = {"day": datetime.timedelta(days=7), "month": datetime.timedelta(days=14),
           "year": datetime.timedelta(days=14)}


@dataclass(frozen=True)
class Period:
    start: datetime.datetime
    end: datetime.datetime  # exclusive
    telling: datetime.timedelta  # how long after the end an episode may still tell of it

    def closeness(self, when: datetime.datetime) -> float:
        """1 inside the period, falling to 0 over `telling` after it; 0 before it."""
        if when < self.start:
            return 0.0
        if when < self.end:
            return 1.0
        late = (when - self.end) / self.telling
        return max(0.0, 1.0 - late)


def _date(year: int, month: int, day: int | None) -> tuple[datetime.datetime, datetime.datetime] | None:
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


def period(text: str) -> Period | None:
    """The most precise period `text` spells out with a year, or None."""
    for pattern, shape in _PATTERNS:
        for m in pattern.finditer(text):
            g = m.groups()
            if shape == "ymd":
                span, unit = _date(int(g[0]), int(g[1]), int(g[2])), "day"
            elif shape == "dmy":
                span, unit = _date(int(g[2]), MONTHS[g[1].lower()], int(g[0])), "day"
            elif shape == "mdy":
                span, unit = _date(int(g[2]), MONTHS[g[0].lower()], int(g[1])), "day"
            elif shape == "ym":
                span, unit = _date(int(g[0]), int(g[1]), None), "month"
            elif shape == "my":
                span, unit = _date(int(g[1]), MONTHS[g[0].lower()], None), "month"
            else:
                year = int(g[0])
                span = (datetime.datetime(year, 1, 1, tzinfo=datetime.timezone.utc),
                        datetime.datetime(year + 1, 1, 1, tzinfo=datetime.timezone.utc))
                unit = "year"
            if span is not None:
                return Period(span[0], span[1], TELLING[unit])
    return None
