"""Repeats folded, the read side (issue 24, docs/repeats.md): search and recall return a first once, with its count.

The issue's check: 500 repeats of one alert and ten distinct episodes, imported as JSONL five minutes apart
(one agent, kind and source), embedded; search for the alert gives one result counting 500 repeats, a search
matching every episode gives eleven results, none twice; --all lists the 501 rows; recall shows the alert once
with its count; the embed worker got eleven chunks.
"""

from __future__ import annotations

import datetime
import json

from memctl import config
from memctl.reading import query as query_mod, search as search_mod
from memctl.recall import recall

START = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(
    days=3
)
ALERT = "alert: disk 91% on web-3"
DISTINCT = [
    f"alert: {what}"
    for what in (
        "nginx upstream timeouts after the deploy",
        "replica lag 40s on db-2",
        "certificate for api.example.com expires",
        "redis evicting keys on cache-1",
        "oom killer hit the search worker",
        "dns resolver answering SERVFAIL",
        "backup of the billing database failed",
        "queue backlog after the consumer crashed",
        "vpn tunnel flapping, mtu mismatch",
        "release 4.2 rolled back",
    )
]


def at(i: int) -> str:
    return (START + datetime.timedelta(minutes=5 * i)).isoformat()


def loaded(cli) -> dict:
    """The corpus imported and embedded: {"import": summary, "embed": summary, "first": the alert's id}."""
    rows = [{"content": ALERT, "created_at": at(i)} for i in range(501)]
    rows += [{"content": text, "created_at": at(501 + i)} for i, text in enumerate(DISTINCT)]
    for row in rows:
        row.update(agent="ops", kind="alert", source="nagios")
    out = cli(
        "episode", "import", "-", "-f", "json", input="".join(json.dumps(r) + "\n" for r in rows)
    )
    assert out.exit_code == 0, out.stderr
    embedded = cli("embed", "-f", "json")
    assert embedded.exit_code == 0, embedded.stderr
    return {"import": out.json()[0], "embed": embedded.json()[0]}


def search(cli, text: str, *args: str) -> list[dict]:
    out = cli("episode", "search", text, "--no-track", "-f", "json", *args)
    assert out.exit_code == 0, out.stderr
    return out.json()


def test_search_returns_a_repeated_alert_once_with_its_count_and_all_lists_every_row(cli, conn):
    figures = loaded(cli)
    assert figures["import"]["folded"] == 500
    assert (figures["embed"]["chunks"], figures["embed"]["embedded"]) == (11, 11)  # not 511

    found = search(cli, "disk 91% on web-3", "-k", "5")
    alert = [r for r in found if r["content"] == ALERT]
    assert len(alert) == 1
    assert (alert[0]["repeats"], alert[0]["first_seen"], alert[0]["last_seen"]) == (
        500,
        at(0),
        at(500),
    )
    assert found[0]["content"] == ALERT

    every = search(cli, "alert", "-k", "20")  # the word every episode has
    assert len(every) == 11 and len({r["id"] for r in every}) == 11
    assert sorted(r["content"] for r in every) == sorted([ALERT, *DISTINCT])
    assert [r["repeats"] for r in every if r["content"] != ALERT] == [0] * 10
    assert all(r["first_seen"] is None for r in every if r["content"] != ALERT)

    for mode in ("text", "vector"):  # each half alone leaves the repeat rows out too
        assert [
            r["content"] for r in search(cli, "disk 91% on web-3", "-k", "20", "-m", mode)
        ].count(ALERT) == 1

    listed = search(cli, "disk 91% on web-3", "-k", "1", "--all")
    first = listed[0]["id"]
    assert listed[0]["repeat_of"] is None and listed[0]["repeats"] == 500
    assert len(listed) == 501 and all(r["repeat_of"] == first for r in listed[1:])
    assert len({r["id"] for r in listed}) == 501 and all(r["content"] == ALERT for r in listed)
    assert [r["created_at"] for r in listed[1:]] == [at(i) for i in range(1, 501)]

    table = cli("episode", "search", "disk 91% on web-3", "-k", "1", "--no-track")
    assert table.exit_code == 0 and "×501" in table.stdout
    table_all = cli("episode", "search", "disk 91% on web-3", "-k", "1", "--no-track", "--all")
    assert table_all.stdout.count(f"repeat of {first}") == 500


def test_recall_and_the_mcp_search_show_the_alert_once_with_its_count(cli, conn):
    loaded(cli)
    out = cli("recall", "disk 91% on web-3", "-f", "json", "--no-track")
    assert out.exit_code == 0, out.stderr
    items = [i for i in out.json()["items"] if i["kind"] == "episode"]
    alert = [i for i in items if i["content"] == ALERT]
    assert len(alert) == 1 and alert[0]["repeats"] == 500
    assert "(seen 501 times, first 3 days ago, last " in alert[0]["text"]
    assert all("seen" not in i["text"] for i in items if i["content"] != ALERT)

    # a custom line without {seen} is unchanged; one with {repeats} gets the count
    settings = config.load()
    conn.use_settings(settings)
    settings.recall = config.Recall(episode_line="* {content} [{repeats}]")
    plain = recall.recall(conn, recall.Request("disk 91% on web-3", agent="ops", track=False))
    assert "* alert: disk 91% on web-3 [500]" in plain.text() and "seen" not in plain.text()

    from memctl.mcp import tools

    hits = search_mod.search(
        conn.use_settings(config.load()), query_mod.Query("disk 91% on web-3", k=3, agent="ops")
    ).hits
    shown = [tools._hit(h) for h in hits]
    assert [s["repeats"] for s in shown if s["text"] == ALERT] == [500]
    assert all("repeats" not in s for s in shown if s["text"] != ALERT)


def test_recall_as_of_counts_only_the_sightings_before_then(cli, conn):
    loaded(cli)
    settings = config.load()
    conn.use_settings(settings)
    then = START + datetime.timedelta(
        minutes=5 * 100, seconds=1
    )  # the first and 100 repeats before it
    past = recall.recall(conn, recall.Request("disk 91% on web-3", agent="ops", as_of=then))
    alert = [i for i in past.items if i.kind == "episode" and i.data["content"] == ALERT]
    assert len(alert) == 1 and alert[0].data["repeats"] == 100
    assert "(seen 101 times, first 8 hours ago, last just now)" in alert[0].line
