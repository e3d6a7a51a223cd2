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


@pytest.mark.parametrize(
    "text, start, end",
    [
        ("what broke on 2026-11-30?", _at(2026, 11, 30), _at(2026, 12, 1)),
        ("What movie did she watch on 1 May, 2022?", _at(2022, 5, 1), _at(2022, 5, 2)),
        ("the 3rd of March 2021", _at(2021, 3, 3), _at(2021, 3, 4)),
        ("March 3rd, 2021 it happened", _at(2021, 3, 3), _at(2021, 3, 4)),
        ("where did she travel in July 2022", _at(2022, 7, 1), _at(2022, 8, 1)),
        ("disk alerts in Feb. 2024", _at(2024, 2, 1), _at(2024, 3, 1)),
        ("alerts of 2026-02", _at(2026, 2, 1), _at(2026, 3, 1)),
        ("what did we ship in 2023", _at(2023, 1, 1), _at(2024, 1, 1)),
        (
            "in 2023, and then on 2024-01-05",
            _at(2024, 1, 5),
            _at(2024, 1, 6),
        ),  # the most precise wins
        ("what failed at 2026-11-30T03:10Z", _at(2026, 11, 30), _at(2026, 12, 1)),
        (
            "31 February, 2022 was",
            _at(2022, 2, 1),
            _at(2022, 3, 1),
        ),  # no such day: its month is still named
        # a span: from its first date's start to its last's end, the first completed by the last
        ("what broke from 2026-11-28 to 2026-11-30?", _at(2026, 11, 28), _at(2026, 12, 1)),
        (
            "Where was John between August 11 and August 15 2023?",
            _at(2023, 8, 11),
            _at(2023, 8, 16),
        ),
        ("between 1 and 15 May 2023", _at(2023, 5, 1), _at(2023, 5, 16)),
        ("from the 1st to the 3rd of May 2022", _at(2022, 5, 1), _at(2022, 5, 4)),
        ("deploys from May to July 2022", _at(2022, 5, 1), _at(2022, 8, 1)),
        (
            "between December 30 and January 2 2023",
            _at(2022, 12, 30),
            _at(2023, 1, 3),
        ),  # across the new year
        ("from Dec 30, 2022 to Jan 2, 2023", _at(2022, 12, 30), _at(2023, 1, 3)),
        ("outages between 2021 and 2023", _at(2021, 1, 1), _at(2024, 1, 1)),
        (
            "logs from the api between 2026-11-28 and 30 November 2026",
            _at(2026, 11, 28),
            _at(2026, 12, 1),
        ),
        (
            "between John and Tim on 11 December, 2023",
            _at(2023, 12, 11),
            _at(2023, 12, 12),
        ),  # no span: a date
        (
            "from 2026-11-30 to 2026-11-28",
            _at(2026, 11, 30),
            _at(2026, 12, 1),
        ),  # backwards: its first date
        (
            "between 30 and 2 January 2023",
            _at(2023, 1, 2),
            _at(2023, 1, 3),
        ),  # a bare day after the last: no span
    ],
)
def test_the_period_a_query_names(text, start, end):
    found = period(text)
    assert found is not None and (found.start, found.end) == (start, end)


@pytest.mark.parametrize(
    "text",
    [
        "May I restart nginx?",
        "release 2022.3 failed",
        "the rollout of 2022.3",
        "2022-13-01 is no date",
        "disk 91% on web-3",
        "last week's deploy",
        "port 2023 refused",
        "INC-2024-05 again",
        "PAY-2024-11-03 refund",
        "image v2024-05-01",
        "in 2022/7",
        "from 2022.3 to 2022.4",
        "between 2023 and 2021",
        "between John and Tim",
    ],
)
def test_text_without_a_date_names_no_period(text):
    assert period(text) is None


def test_closeness_is_one_in_the_period_and_falls_over_its_telling_time_after_it():
    day = period("on 2026-05-12")
    assert day.closeness(_at(2026, 5, 12, 23, 59)) == 1.0
    assert day.closeness(_at(2026, 5, 11, 23, 59)) == 0.0  # before it happened
    assert day.closeness(_at(2026, 5, 13) + day.telling / 2) == pytest.approx(0.5)
    assert day.closeness(_at(2026, 5, 13) + day.telling) == 0.0
    # a first whose repeats were seen until a later time: its span reaches into the period, or not
    assert day.closeness(_at(2026, 5, 1), last_seen=_at(2026, 5, 20)) == 1.0
    assert day.closeness(_at(2026, 5, 1), last_seen=_at(2026, 5, 11, 23, 59)) == 0.0


DEPLOYS = {  # same words for the query, told in three months; the latest is the most recent
    "2026-03-10T09:00:00+00:00": "the api deploy failed: migration lock timeout on the orders table",
    "2026-05-12T09:00:00+00:00": "the api deploy failed: health check never passed on the canary pods",
    "2026-07-20T09:00:00+00:00": "the api deploy failed: image pull backoff from the private registry",
}


@pytest.mark.parametrize(
    "query, settings_text, expected",
    [
        ("why did the api deploy fail in May 2026?", "", "2026-05-12"),
        ("why did the api deploy fail on 12 May, 2026?", "", "2026-05-12"),
        ("why did the api deploy fail in March 2026?", "", "2026-03-10"),
        (
            "why did the api deploy fail between March 1 and March 15 2026?",
            "",
            "2026-03-10",
        ),  # a span
        ("why did the api deploy fail from 2026-05-01 to 2026-05-31?", "", "2026-05-12"),
        (
            "why did the api deploy fail?",
            "",
            "2026-07-20",
        ),  # no date: recency decides between equals
        (
            "why did the api deploy fail in May 2026?",
            "[search]\nwhen_weight = 0\n",
            "2026-07-20",
        ),  # the term off
    ],
)
def test_a_query_naming_a_date_ranks_what_was_written_then_first(
    cli, memctl_env, query, settings_text, expected
):
    rows = [
        {"content": text, "kind": "deploy", "agent": "ops", "created_at": when}
        for when, text in DEPLOYS.items()
    ]
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(settings_text)
    found = cli("episode", "search", query, "--mode", "text", "-k", "3", "-f", "json", "--no-track")
    assert found.exit_code == 0, found.stderr
    hits = found.json()
    assert len(hits) == 3
    assert hits[0]["created_at"].startswith(expected), [(h["created_at"], h["score"]) for h in hits]


@pytest.mark.parametrize("mode", ["text", "hybrid"])
def test_the_episodes_of_the_period_a_query_names_are_candidates_however_many_say_the_same(
    cli, memctl_env, mode
):
    """Each half also runs inside the period (memctl.reading.statement): the day's episode is found even
    when the same words and meaning fill more of the log than the halves read."""
    days = [datetime.date(2026, 4, 1) + datetime.timedelta(days=i) for i in range(60)]
    rows = [
        {
            "content": f"the api deploy of build {1000 + i} failed: health check never passed",
            "kind": "deploy",
            "agent": "ops",
            "created_at": f"{day.isoformat()}T09:00:00+00:00",
        }
        for i, day in enumerate(days)
    ]
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr
    assert cli("embed").exit_code == 0
    # each half reads 4 candidates (k 1): 60 equals, the day's among them only by the period
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[search]\ncandidates = 1\n")
    for day in ("2026-04-03", "2026-05-12"):
        found = cli(
            "episode",
            "search",
            f"why did the api deploy fail on {day}?",
            "--mode",
            mode,
            "-k",
            "1",
            "-f",
            "json",
            "--no-track",
        )
        assert found.exit_code == 0, found.stderr
        assert [h["created_at"][:10] for h in found.json()] == [day]
    # with the time term off, the period is not read: another day's comes first (by words: the most recent)
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[search]\ncandidates = 1\nwhen_weight = 0\n")
    found = cli(
        "episode",
        "search",
        "why did the api deploy fail on 2026-04-03?",
        "--mode",
        mode,
        "-k",
        "1",
        "-f",
        "json",
        "--no-track",
    )
    assert found.exit_code == 0, found.stderr
    got = found.json()[0]["created_at"][:10]
    assert got != "2026-04-03" and (mode != "text" or got == days[-1].isoformat())


def test_a_repeated_episode_seen_in_the_period_counts_as_written_in_it(cli, memctl_env):
    """A first stands for its repeats (docs/repeats.md): an alert folded from April 1 to May 30 was seen on
    May 12, so a query naming May 12 finds it and scores it as of that day."""
    days = [datetime.date(2026, 4, 1) + datetime.timedelta(days=i) for i in range(60)]
    rows = [
        {
            "content": "the api health check failed on the canary pods",
            "kind": "alert",
            "agent": "ops",
            "created_at": f"{day.isoformat()}T09:00:00+00:00",
        }
        for day in days
    ]
    # the same words told again two days later, once: without the span, the nearer one in time
    rows.append(
        {
            "content": "the api health check failed on the canary pods again",
            "kind": "alert",
            "agent": "ops",
            "created_at": "2026-05-14T09:00:00+00:00",
        }
    )
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr
    found = cli(
        "episode",
        "search",
        "did the api health check fail on 2026-05-12?",
        "--mode",
        "text",
        "-k",
        "2",
        "-f",
        "json",
        "--no-track",
    )
    assert found.exit_code == 0, found.stderr
    first = found.json()[0]
    assert (first["created_at"][:10], first["repeats"], first["last_seen"][:10]) == (
        "2026-04-01",
        59,
        "2026-05-30",
    )


def test_dated_queries_prepared_and_planned_once_answer_as_each_planned_alone(
    cli, conn, db_url, memctl_env
):
    """A batch prepares its statement after a few uses (docs/search.md); the period's runs choose between
    ranking the period exactly and the indexes at execution, so a generic plan answers as a fresh one."""
    from memctl import config, db
    from memctl.reading import search
    from memctl.reading.query import Query

    days = [datetime.date(2026, 4, 1) + datetime.timedelta(days=i) for i in range(40)]
    # the same words each day (a source of its own each, so none is a repeat): only the date tells them apart
    rows = [
        {
            "content": f"the {svc} deploy failed",
            "kind": "deploy",
            "agent": f"a{i % 2}",
            "source": f"ci-{i}",
            "created_at": f"{day.isoformat()}T09:00:00+00:00",
        }
        for i, (day, svc) in enumerate((d, s) for d in days for s in ("api", "billing"))
    ]
    assert (
        cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows)).exit_code
        == 0
    )
    assert cli("embed").exit_code == 0
    settings = config.load()
    conn.use_settings(settings)
    texts = [
        f"why did the {svc} deploy fail on {day.isoformat()}?"
        for day in days[::5]
        for svc in ("api", "billing")
    ]
    queries = [Query(t, k=3, agent=("a0", None)[i % 2]) for i, t in enumerate(texts * 3)]
    batch = search.search_batch(conn, queries)
    alone = []
    for q in queries:
        with db.connect(db_url, vector=True) as fresh:
            alone.append(search.search(fresh.use_settings(settings), q))
    assert [[h.id for h in o.hits] for o in batch] == [[h.id for h in o.hits] for o in alone]
    prepared = conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
        "WHERE statement LIKE '%period_eps AS MATERIALIZED%'"
    ).fetchall()
    # planned once (generic) after five custom plans: the answers above include the generic plan's
    assert prepared and sum(r["generic_plans"] for r in prepared) > 0
    # every answer's first is of the day it names
    assert all(
        o.hits and o.hits[0].created_at.date().isoformat() in q.text for o, q in zip(batch, queries)
    )


@pytest.mark.parametrize("mode", ["text", "hybrid"])
def test_a_period_of_many_episodes_runs_each_half_on_its_index_and_answers_as_ranked_exactly(
    cli, conn, memctl_env, monkeypatch, mode
):
    """Up to statement.PERIOD_EXACT episodes in the period are ranked exactly; more, and each half runs on its
    index filtered to the period: the same candidates."""
    from memctl import config
    from memctl.reading import bm25, search, statement
    from memctl.reading.query import Query

    days = [datetime.date(2026, 4, 1) + datetime.timedelta(days=i) for i in range(60)]
    rows = [
        {
            "content": f"the api deploy of build {1000 + i} failed",
            "kind": "deploy",
            "agent": "ops",
            "created_at": f"{day.isoformat()}T09:00:00+00:00",
        }
        for i, day in enumerate(days)
    ]
    assert (
        cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows)).exit_code
        == 0
    )
    assert cli("embed").exit_code == 0
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[search]\ncandidates = 1\n")
    settings = config.load()
    conn.use_settings(settings)
    queries = [
        Query("why did the api deploy fail in May 2026?", k=8, agent="ops", mode=mode),
        Query("why did the api deploy fail on 2026-04-20?", k=1, mode=mode),
    ]
    answers = {}
    for exact in (1000, 5):  # May holds 30 of the episodes, a day one
        monkeypatch.setattr(statement, "PERIOD_EXACT", exact)
        statement._TEXTS.clear()
        answers[exact] = [[h.id for h in search.search(conn, q).hits] for q in queries]
    statement._TEXTS.clear()
    assert answers[1000] == answers[5]
    # the bound a share of the table: all of its 60 episodes here, so May's 30 are ranked exactly again
    monkeypatch.setattr(statement, "PERIOD_EXACT_SHARE", 1.0)
    monkeypatch.setattr(bm25, "_CACHE", {})  # the table's count read now, not an earlier test's
    assert [h.id for h in search.search(conn, queries[0]).hits] == answers[5][0]
    assert [shape[-1] for shape in statement._TEXTS] == [
        60
    ]  # the bound the statement was written with
    statement._TEXTS.clear()
    by_id = {
        h["id"]: h
        for h in cli("episode", "list", "--agent", "ops", "-n", "100", "-f", "json").json()
    }
    assert all(by_id[i]["created_at"].startswith("2026-05") for i in answers[5][0])
    assert [by_id[i]["created_at"][:10] for i in answers[5][1]] == ["2026-04-20"]


def test_a_query_naming_a_date_leaves_recency_out(cli, memctl_env):
    """It asks about then: last week's failure, told in the same words, is not nearer its answer."""
    recent = (datetime.datetime.now(UTC) - datetime.timedelta(days=2)).isoformat()
    rows = [
        {
            "content": "the api deploy failed: disk full",
            "kind": "deploy",
            "agent": "ops",
            "source": source,
            "created_at": when,
        }
        for source, when in (("ci-1", "2026-03-10T09:00:00+00:00"), ("ci-2", recent))
    ]
    assert (
        cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows)).exit_code
        == 0
    )
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        "[search]\nrecency_weight = 0.5\n"
    )  # more than when_weight

    def first(query: str) -> str:
        found = cli(
            "episode", "search", query, "--mode", "text", "-k", "2", "-f", "json", "--no-track"
        )
        assert found.exit_code == 0, found.stderr
        return found.json()[0]["created_at"][:10]

    assert first("why did the api deploy fail on 2026-03-10?") == "2026-03-10"
    assert first("why did the api deploy fail?") == recent[:10]  # no date: recency counts


def test_json_rows_carry_the_time_terms_share_and_the_score_adds_up(cli, memctl_env):
    """`closeness`: 1 written in the period, a share told after it, 0 before or long after; None undated.
    With it a dated row's score is relevance + importance + when terms (recency left out)."""
    told_later = {
        "2026-05-15T09:00:00+00:00": "the api deploy failed: canary pods again, three days on"
    }
    rows = [
        {"content": text, "kind": "deploy", "agent": "ops", "created_at": when}
        for when, text in {**DEPLOYS, **told_later}.items()
    ]
    assert (
        cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows)).exit_code
        == 0
    )

    def search(query: str) -> dict[str, dict]:
        found = cli(
            "episode", "search", query, "--mode", "text", "-k", "4", "-f", "json", "--no-track"
        )
        assert found.exit_code == 0, found.stderr
        return {h["created_at"][:10]: h for h in found.json()}

    dated = search("why did the api deploy fail on 12 May, 2026?")
    told = (_at(2026, 5, 15, 9) - _at(2026, 5, 13)) / datetime.timedelta(
        days=7
    )  # of its week's telling time
    assert {day: h["closeness"] for day, h in dated.items()} == pytest.approx(
        {"2026-05-12": 1.0, "2026-05-15": 1 - told, "2026-03-10": 0.0, "2026-07-20": 0.0}, abs=1e-6
    )
    for h in dated.values():
        assert h["score"] == pytest.approx(
            h["relevance"] + 0.2 * h["importance_term"] + 0.2 * h["closeness"], abs=1e-5
        )
    undated = search("why did the api deploy fail?")
    assert len(undated) == 4 and all(h["closeness"] is None for h in undated.values())
    for h in undated.values():
        assert h["score"] == pytest.approx(
            h["relevance"] + 0.2 * h["recency"] + 0.2 * h["importance_term"], abs=1e-5
        )


def test_a_periods_exact_bound_is_a_share_of_the_table_over_a_floor():
    """Ranked exactly up to PERIOD_EXACT episodes, or 1% of the table when more (tests/bench/period.py: at 1M a
    filtered index scan of a 0.6% period cost 249 ms a query against 57 exactly)."""
    from memctl.reading.statement import PERIOD_EXACT, period_exact

    assert period_exact(0) == period_exact(300_000) == PERIOD_EXACT == 5000
    assert (
        period_exact(1_000_000) == period_exact(1_400_000) == 10_000
    )  # in steps: the statement's text holds
    assert period_exact(10_000_000) == 100_000
