"""A query that names a date ("in May 2026", "on 12 May, 2026", "2026-05-12"): the time term of scoring
(memctl.reading.when, [search] when_weight)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from memctl.reading.when import period

UTC = datetime.timezone.utc


def _at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


@pytest.mark.parametrize("text, start, end", [
    ("what broke on 2026-11-30?", _at(2026, 11, 30), _at(2026, 12, 1)),
    ("What movie did she watch on 1 May, 2022?", _at(2022, 5, 1), _at(2022, 5, 2)),
    ("the 3rd of March 2021", _at(2021, 3, 3), _at(2021, 3, 4)),
    ("March 3rd, 2021 it happened", _at(2021, 3, 3), _at(2021, 3, 4)),
    ("where did she travel in July 2022", _at(2022, 7, 1), _at(2022, 8, 1)),
    ("disk alerts in Feb. 2024", _at(2024, 2, 1), _at(2024, 3, 1)),
    ("alerts of 2026-02", _at(2026, 2, 1), _at(2026, 3, 1)),
    ("what did we ship in 2023", _at(2023, 1, 1), _at(2024, 1, 1)),
    ("in 2023, and then on 2024-01-05", _at(2024, 1, 5), _at(2024, 1, 6)),  # the most precise wins
    ("what failed at 2026-11-30T03:10Z", _at(2026, 11, 30), _at(2026, 12, 1)),
    ("31 February, 2022 was", _at(2022, 2, 1), _at(2022, 3, 1)),  # no such day: its month is still named
    # a span: from its first date's start to its last's end, the first completed by the last
    ("what broke from 2026-11-28 to 2026-11-30?", _at(2026, 11, 28), _at(2026, 12, 1)),
    ("Where was John between August 11 and August 15 2023?", _at(2023, 8, 11), _at(2023, 8, 16)),
    ("between 1 and 15 May 2023", _at(2023, 5, 1), _at(2023, 5, 16)),
    ("from the 1st to the 3rd of May 2022", _at(2022, 5, 1), _at(2022, 5, 4)),
    ("deploys from May to July 2022", _at(2022, 5, 1), _at(2022, 8, 1)),
    ("between December 30 and January 2 2023", _at(2022, 12, 30), _at(2023, 1, 3)),  # across the new year
    ("from Dec 30, 2022 to Jan 2, 2023", _at(2022, 12, 30), _at(2023, 1, 3)),
    ("outages between 2021 and 2023", _at(2021, 1, 1), _at(2024, 1, 1)),
    ("logs from the api between 2026-11-28 and 30 November 2026", _at(2026, 11, 28), _at(2026, 12, 1)),
    ("between John and Tim on 11 December, 2023", _at(2023, 12, 11), _at(2023, 12, 12)),  # no span: a date
    ("from 2026-11-30 to 2026-11-28", _at(2026, 11, 30), _at(2026, 12, 1)),  # backwards: its first date
])
def test_the_period_a_query_names(text, start, end):
    found = period(text)
    assert found is not None and (found.start, found.end) == (start, end)


@pytest.mark.parametrize("text", [
    "May I restart nginx?", "release 2022.3 failed", "the rollout of 2022.3", "2022-13-01 is no date",
    "disk 91% on web-3", "last week's deploy", "port 2023 refused", "INC-2024-05 again", "PAY-2024-11-03 refund",
    "image v2024-05-01", "in 2022/7", "from 2022.3 to 2022.4", "between 2023 and 2021", "between John and Tim",
])
def test_text_without_a_date_names_no_period(text):
    assert period(text) is None


def test_closeness_is_one_in_the_period_and_falls_over_its_telling_time_after_it():
    day = period("on 2026-05-12")
    assert day.closeness(_at(2026, 5, 12, 23, 59)) == 1.0
    assert day.closeness(_at(2026, 5, 11, 23, 59)) == 0.0  # before it happened
    assert day.closeness(_at(2026, 5, 13) + day.telling / 2) == pytest.approx(0.5)
    assert day.closeness(_at(2026, 5, 13) + day.telling) == 0.0


DEPLOYS = {  # same words for the query, told in three months; the latest is the most recent
    "2026-03-10T09:00:00+00:00": "the api deploy failed: migration lock timeout on the orders table",
    "2026-05-12T09:00:00+00:00": "the api deploy failed: health check never passed on the canary pods",
    "2026-07-20T09:00:00+00:00": "the api deploy failed: image pull backoff from the private registry",
}


@pytest.mark.parametrize("query, settings_text, expected", [
    ("why did the api deploy fail in May 2026?", "", "2026-05-12"),
    ("why did the api deploy fail on 12 May, 2026?", "", "2026-05-12"),
    ("why did the api deploy fail in March 2026?", "", "2026-03-10"),
    ("why did the api deploy fail between March 1 and March 15 2026?", "", "2026-03-10"),  # a span
    ("why did the api deploy fail from 2026-05-01 to 2026-05-31?", "", "2026-05-12"),
    ("why did the api deploy fail?", "", "2026-07-20"),  # no date: recency decides between equals
    ("why did the api deploy fail in May 2026?", "[search]\nwhen_weight = 0\n", "2026-07-20"),  # the term off
])
def test_a_query_naming_a_date_ranks_what_was_written_then_first(cli, memctl_env, query, settings_text, expected):
    rows = [{"content": text, "kind": "deploy", "agent": "ops", "created_at": when} for when, text in DEPLOYS.items()]
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(settings_text)
    found = cli("episode", "search", query, "--mode", "text", "-k", "3", "-f", "json", "--no-track")
    assert found.exit_code == 0, found.stderr
    hits = found.json()
    assert len(hits) == 3
    assert hits[0]["created_at"].startswith(expected), [(h["created_at"], h["score"]) for h in hits]
