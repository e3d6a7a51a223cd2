"""The talk a turn is part of: the session term (session_weight) and the neighbours' word share
(context_text_weight) of memctl.reading.fusion, on small constructed conversations."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from memctl import config
from memctl.reading import fusion, search
from memctl.reading.query import Query

# Two talks of one agent, four days apart, turns a minute apart. Both hold a turn naming the ferry; the
# first's is longer (a lower BM25) and its talk also holds, three turns on, a turn about the lighthouse.
FIRST_TALK = [
    "Ana: the ferry to the island was late again this morning and we waited on the pier for an hour",
    "Ben: that sounds tiring, did you at least get a coffee",
    "Ana: yes and a croissant from the bakery by the square",
    "Ben: we climbed the lighthouse and the lighthouse keeper showed us the old lamp",
]
SECOND_TALK = [
    "Ana: the ferry left early today",
    "Ben: nice, the weather was good all week",
    "Ana: we had lunch by the harbour and walked back",
]
QUESTION = "lighthouse ferry"


def _load(cli) -> list[int]:
    rows = [
        {
            "content": text,
            "kind": "conversation",
            "agent": "a",
            "created_at": f"2026-01-01T10:0{i}:00+00:00",
        }
        for i, text in enumerate(FIRST_TALK)
    ]
    rows += [
        {
            "content": text,
            "kind": "conversation",
            "agent": "a",
            "created_at": f"2026-01-05T10:0{i}:00+00:00",
        }
        for i, text in enumerate(SECOND_TALK)
    ]
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr
    found = cli("episode", "search", "ferry", "-k", "10", "-f", "json", "--no-track")
    assert found.exit_code == 0, found.stderr
    by_text = {h["content"]: h["id"] for h in found.json()}
    return [by_text[FIRST_TALK[0]], by_text[SECOND_TALK[0]]]


def _order(conn, memctl_env, settings_text: str) -> list[int]:
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(settings_text)
    outcome = search.search(
        conn.use_settings(config.load()), Query(QUESTION, k=10, agent="a", mode="text")
    )
    return [h.id for h in outcome.hits]


@pytest.mark.parametrize(
    "settings_text, first_talk_first",
    [
        (
            "",
            True,
        ),  # defaults: the session term lifts the ferry turn of the talk that names the lighthouse
        (
            "[search]\nsession_weight = 0.0\n",
            False,
        ),  # off: the shorter ferry turn wins on its words
        (
            '[search]\ncontext_window = "1m"\n',
            False,
        ),  # the lighthouse turn is three minutes on: another session
    ],
)
def test_a_turn_of_a_talk_that_also_answers_the_query_ranks_above_a_lone_match(
    cli, conn, memctl_env, settings_text, first_talk_first
):
    first, second = _load(cli)
    order = _order(conn, memctl_env, settings_text)
    assert first in order and second in order
    assert (order.index(first) < order.index(second)) is first_talk_first


def _row(episode_id: int, similarity: float, words: float, day: int) -> dict:
    return {
        "id": episode_id,
        "agent": "a",
        "kind": "conversation",
        "distance": 1 - similarity,
        "text_score": words,
        "created_at": datetime.datetime(2026, 1, day, tzinfo=datetime.timezone.utc),
    }


def test_a_neighbour_counts_by_its_words_more_than_by_its_cosine():
    """X's neighbour is only close in cosine (as every turn of a talk is); Y's shares the query's words.

    Equal-weight halves put X first (0.30 against 0.275); with context_text_weight 0.7 Y's neighbour
    weighs 0.305 against 0.18, and Y is first.
    """
    x, near_x, y, near_y = 1, 2, 3, 4
    scored = {
        x: _row(x, 0.3, 0.1, 1),
        near_x: _row(near_x, 0.6, 0.0, 1),
        y: _row(y, 0.3, 0.1, 3),
        near_y: _row(near_y, 0.2, 0.35, 3),
    }
    context = {x: (near_x, None), y: (near_y, None)}
    vector_rows = [{"episode_id": i, "content": ""} for i in (near_x, x, y, near_y)]
    text_rows = [{"episode_id": i} for i in (near_y, x, y)]

    def relevance(share: float) -> dict[int, float]:
        settings = config.Settings(search=config.Search(context_text_weight=share))
        return fusion.relevances(
            settings, vector_rows, text_rows, scored, context, text_ceiling=1.0
        )

    equal, words = relevance(0.5), relevance(0.7)
    assert equal[x] > equal[y]
    assert words[y] > words[x]
    # on words alone (no vector half) a neighbour's base is its words, whatever the setting
    settings = config.Settings(search=config.Search(context_text_weight=0.0))
    alone = fusion.relevances(settings, None, text_rows, scored, context, text_ceiling=1.0)
    assert alone[y] > alone[x]


# A talk where the answer is a reply that shares no word with the question asked of memory; other
# turns name the turtles but say nothing of how long.
TURTLE_TALK = [
    "Ana: I saw a heron at the lake this morning",
    "Ben: my turtles would hide from a heron for sure",
    "Ana: how long have you had your turtles, Ben?",
    "Ben: three years now and they bring me tons of joy",
    "Ana: that is lovely, do they have names",
    "Ben: the turtles sleep a lot in the winter",
    "Ana: the lake freezes over in January",
]
REPLY, NAMES_THEM = TURTLE_TALK[3], TURTLE_TALK[5]


def _turtle_order(cli, memctl_env, settings_text: str) -> list[str]:
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(settings_text)
    found = cli(
        "episode",
        "search",
        "how long were the turtles kept",
        "--mode",
        "text",
        "-k",
        "10",
        "-f",
        "json",
        "--no-track",
    )
    assert found.exit_code == 0, found.stderr
    return [h["content"] for h in found.json()]


def test_a_reply_to_a_question_is_scored_with_the_question_it_answers(cli, memctl_env):
    rows = [
        {
            "content": text,
            "kind": "conversation",
            "agent": "a",
            "created_at": f"2026-01-01T10:0{i}:00+00:00",
        }
        for i, text in enumerate(TURTLE_TALK)
    ]
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr
    # defaults: the reply, found by neither half, is fetched beside the question and lifted by it (the
    # neighbour term and the reply term) above a turn that holds a word of the query
    order = _turtle_order(cli, memctl_env, "")
    assert order[0] == TURTLE_TALK[2] and order.index(REPLY) < order.index(NAMES_THEM)
    # without the reply term it is still a candidate, lifted by its neighbour alone: below that turn
    order = _turtle_order(cli, memctl_env, "[search]\nreply_weight = 0\n")
    assert REPLY in order and order.index(REPLY) > order.index(NAMES_THEM)
    # without neighbours nothing finds it
    assert REPLY not in _turtle_order(cli, memctl_env, "[search]\ncontext_weight = 0\n")


def test_a_neighbour_added_beside_a_found_entry_knows_that_entry():
    """statement.neighbours: the statement names the neighbours of the entries the halves found; an
    entry it added as one of them gets the found entry as its own neighbour, on the right side."""
    from memctl.reading.statement import neighbours

    rows = [
        {"id": 5, "neighbours": [4, 6]},
        {"id": 8, "neighbours": [None, 9]},
        {"id": 10, "neighbours": [9, None]},
        {"id": 4, "neighbours": None},
        {"id": 6, "neighbours": None},
        {"id": 9, "neighbours": None},
    ]
    assert neighbours(rows) == {
        5: (4, 6),
        8: (None, 9),
        10: (9, None),
        4: (None, 5),
        6: (5, None),
        9: (8, 10),
    }


@pytest.mark.parametrize(
    "text, asks",
    [
        ("Ana: how long have you had your turtles, Ben?", True),
        ("really?! three years?", True),
        ('she said "why?" and left', True),
        ("ok? then restart it", True),
        (
            "Ana: the turtles pic https://photos.example.com/view?id=12",
            False,
        ),  # a URL's query, not a question
        ("GET /search?q=disk%20full&page=2 returned 502", False),
        ("no question here", False),
    ],
)
def test_a_question_is_a_question_mark_that_no_url_query_follows(text, asks):
    assert fusion.asks(text) is asks


def test_a_url_query_before_a_turn_lifts_it_as_no_question(cli, memctl_env):
    """The reply term weighs the turn before a candidate when it asks; a "?" opening a URL's query does not."""
    talk = list(TURTLE_TALK)
    talk[2] = "Ana: your turtles are on https://photos.example.com/view?album=turtles&id=12"
    rows = [
        {
            "content": text,
            "kind": "conversation",
            "agent": "a",
            "created_at": f"2026-01-01T10:0{i}:00+00:00",
        }
        for i, text in enumerate(talk)
    ]
    result = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert result.exit_code == 0, result.stderr

    def relevance(settings_text: str) -> float:
        Path(memctl_env["MEMCTL_CONFIG"]).write_text(settings_text)
        found = cli(
            "episode",
            "search",
            "how long were the turtles kept",
            "--mode",
            "text",
            "-k",
            "10",
            "-f",
            "json",
            "--no-track",
        )
        assert found.exit_code == 0, found.stderr
        return next(h["relevance"] for h in found.json() if h["content"] == REPLY)

    assert relevance("") == relevance("[search]\nreply_weight = 0\n")
