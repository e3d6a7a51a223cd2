"""Repeats folded (issue 24, docs/repeats.md): the write side, retention, summaries and the embedder's savings.

The issue's check first: 500 repeats of one alert plus ten distinct episodes store eleven firsts, one of them
counting 500 repeats, and the embedder is asked for 500 fewer texts than with folding off. Then every write
path (add, episode import, memctl import), the window, what does not fold, prune, purge, delete, summaries,
the export round trip, and writers racing each other. Every test ends with the invariant check.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import threading
from pathlib import Path

from memctl import config, db
from memctl.records import episodes
from memctl.write import gate, repeats
from tests.conftest import fresh_database

NOW = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
ALERT = "disk 91% on web-3"
DISTINCT = [
    f"incident {i}: {what}"
    for i, what in enumerate(
        (
            "nginx upstream timeouts after the 14:02 deploy",
            "replica lag 40s on db-2, vacuum freeze running",
            "certificate for api.example.com expires in 6 days",
            "redis evicting keys: maxmemory 2gb reached",
            "kernel oom killer hit the search worker",
            "dns resolver 10.0.0.2 answering SERVFAIL",
            "backup of the billing database took 3h, twice the usual",
            "queue backlog 12k after the consumer crashed",
            "vpn tunnel flapping every 90 minutes, mtu mismatch",
            "release 4.2 rolled back: migration locked orders",
        )
    )
]


def ago(**delta) -> datetime.datetime:
    return NOW - datetime.timedelta(**delta)


def configure(memctl_env, text: str) -> None:
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(text)


def scalar(conn, query, params=None):
    return next(iter(conn.execute(query, params).fetchone().values()))


def add(conn, text: str, **fields) -> episodes.Added:
    return episodes.add_episode(conn.use_settings(config.load()), text, **fields)


def load(cli, rows: list[dict], *args: str) -> dict:
    out = cli(
        "episode",
        "import",
        "-",
        "-f",
        "json",
        *args,
        input="".join(json.dumps(r) + "\n" for r in rows),
    )
    assert out.exit_code == 0, out.stderr
    return out.json()[0]


def firsts(conn) -> dict[str, dict]:
    """Firsts by text: {content: {id, repeats, created_at, last_seen_at}}."""
    rows = conn.execute(
        "SELECT id, content, repeats, created_at, last_seen_at FROM episodes "
        "WHERE repeat_of IS NULL ORDER BY id"
    ).fetchall()
    return {r.pop("content"): r for r in rows}


def check_invariant(conn) -> None:
    """Counts equal the linked rows, last_seen_at is the latest of them, repeats have no chunks, every repeat's
    first exists, is a first, and shares its agent, kind, source, importance and normalized text."""
    bad = conn.execute("""
        SELECT f.id, f.repeats, count(r.id) AS linked, f.last_seen_at, max(r.created_at) AS latest
        FROM episodes f LEFT JOIN episodes r ON r.agent = f.agent AND r.repeat_of = f.id
        WHERE f.repeat_of IS NULL GROUP BY f.id, f.repeats, f.last_seen_at
        HAVING f.repeats <> count(r.id) OR f.last_seen_at IS DISTINCT FROM max(r.created_at)""").fetchall()
    assert bad == []
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM chunks c JOIN episodes e ON e.agent = c.agent AND e.id = c.episode_id "
            "WHERE e.repeat_of IS NOT NULL",
        )
        == 0
    )
    assert (
        scalar(
            conn,
            """
        SELECT count(*) FROM episodes r LEFT JOIN episodes f ON f.agent = r.agent AND f.id = r.repeat_of
        WHERE r.repeat_of IS NOT NULL AND (f.id IS NULL OR f.repeat_of IS NOT NULL OR f.kind <> r.kind
              OR f.source IS DISTINCT FROM r.source OR f.norm_hash <> r.norm_hash OR f.importance <> r.importance
              OR f.created_at > r.created_at)""",
        )
        == 0
    )


def embedded_texts(ollama) -> int:
    return sum(n for _, _, n in ollama.embed_requests())


def embed(cli, env: dict | None = None) -> dict:
    out = cli("embed", "-f", "json", env=env)
    assert out.exit_code == 0, out.stderr
    return out.json()[0]


# An agent writes the same alert with small differences the normalization takes out (case, spacing, width).
VARIANTS = [ALERT, "Disk 91% on web-3", "disk  91% on web-3", "DISK 91% ON\tＷＥＢ-3 "]


# --- the check ---------------------------------------------------------------------------------------


def test_500_repeats_and_ten_distinct_store_eleven_firsts_and_500_fewer_chunks_to_embed(
    cli, conn, ollama_env, ollama, pg_server
):
    """Folded, the embed worker gets 500 fewer chunks: no queue row, no vector row, no embedder request for a
    repeat. (Unfolded, the worker would copy the vector of a byte-identical text instead of asking the embedder
    again: the embedder's own saving is the variants the normalization folds, here 3 texts.)"""
    embed(cli)  # the model registered before counting
    ollama.requests.clear()
    for i in range(501):  # the alert and 500 repeats of it, every five minutes
        add(
            conn,
            VARIANTS[i % 4],
            kind="alert",
            source="nagios",
            created_at=ago(minutes=5 * (501 - i)),
        )
    for text in DISTINCT:
        add(conn, text, kind="alert", source="nagios")
    assert scalar(conn, "SELECT count(*) FROM embed_queue") == 11
    folded = embed(cli)
    folded["texts"] = embedded_texts(ollama)

    stored = firsts(conn)
    assert len(stored) == 11 and scalar(conn, "SELECT count(*) FROM episodes") == 511
    assert (
        stored[ALERT]["repeats"] == 500
        and [r["repeats"] for t, r in stored.items() if t != ALERT] == [0] * 10
    )
    assert stored[ALERT]["last_seen_at"] == ago(minutes=5)
    assert (folded["chunks"], folded["embedded"], folded["copied"], folded["texts"]) == (
        11,
        11,
        0,
        11,
    )

    # The read side's view: one result with its count and first/last seen; --all lists every row.
    first = stored[ALERT]["id"]
    info = episodes.repeat_info(conn, [first], agent="default")[first]
    assert (info["repeats"], info["first_seen"], info["last_seen"]) == (
        500,
        ago(minutes=2505),
        ago(minutes=5),
    )
    every = episodes.repeats_of(conn, "default", first)
    assert (
        len(every) == 501 and every[0]["id"] == first and every[-1]["created_at"] == ago(minutes=5)
    )

    # The same writes with folding off, in a database of their own.
    configure(ollama_env, "[episodes]\nfold = false\n")
    ollama.requests.clear()
    with fresh_database(pg_server) as url, db.connect(url) as other:
        for i in range(501):
            add(
                other,
                VARIANTS[i % 4],
                kind="alert",
                source="nagios",
                created_at=ago(minutes=5 * (501 - i)),
            )
        for text in DISTINCT:
            add(other, text, kind="alert", source="nagios")
        unfolded = embed(cli, env={"MEMCTL_DATABASE_URL": url})
    unfolded["texts"] = embedded_texts(ollama)
    assert unfolded["chunks"] - folded["chunks"] == 500
    assert unfolded["embedded"] + unfolded["copied"] - folded["embedded"] == 500
    assert (unfolded["texts"] - folded["texts"], unfolded["copied"]) == (3, 497)
    check_invariant(conn)


# --- what folds ----------------------------------------------------------------------------------------------


def test_normalization_folds_case_spacing_and_width_and_keeps_punctuation_digits_and_units():
    same = ["Disk 91% on web-3", "  disk   91%\ton WEB-3  ", "ｄｉｓｋ 91% on web-3"]
    assert {repeats.normalize(t) for t in same} == {"disk 91% on web-3"}
    assert len({repeats.norm_hash(t) for t in same}) == 1
    different = [
        "disk 91% on web-3",
        "disk 92% on web-3",
        "disk 91 on web-3",
        "disk 91% on web-4",
        "-5 degrees",
        "5 degrees",
        "disk 91% on (web-3)",
        "disk 91% on web-3.",
        "\u201cdisk 91% on web-3\u201d!",
        "Should we roll back the deploy?",
        "Should we roll back the deploy!",
    ]
    assert len({repeats.norm_hash(t) for t in different}) == len(different)
    assert repeats.normalize("(resolved)") == "(resolved)" and repeats.normalize("-5") == "-5"


def test_meta_punctuation_and_distinct_secrets_keep_episodes_apart(cli, conn, memctl_env):
    """The issue's three: another host in meta, another sentence mark, another token redacted to the same text
    are other events; the same meta (in any key order), the same token and the same secret-free text fold."""

    def added(*args: str) -> dict:
        result = cli("episode", "add", *args, "-f", "json")
        assert result.exit_code == 0, result.stderr
        return result.json()[0] if isinstance(result.json(), list) else result.json()

    web1 = added("deploy finished", "--meta", '{"host":"web-1","n":1}')
    assert added("deploy finished", "--meta", '{"host":"web-2","n":1}')["folded_into"] is None
    assert (
        added("deploy finished", "--meta", '{"n":1, "host":"web-1"}')["folded_into"] == web1["id"]
    )
    ask = added("Should we roll back the deploy?")
    assert added("Should we roll back the deploy!")["folded_into"] is None
    assert added("should  we roll back the deploy?")["folded_into"] == ask["id"]
    one, two = (
        "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt",
        "ghp_zYxW9876VuTs5432RqPo1098NmLk7654JiHg",
    )
    leaked = added(f"login with token {one}")
    assert added(f"login with token {two}")["folded_into"] is None
    assert added(f"login with token {one}")["folded_into"] == leaked["id"]
    stored = conn.execute(
        "SELECT content, norm_hash FROM episodes WHERE content LIKE 'login%' ORDER BY id"
    ).fetchall()
    assert (
        len({r["content"] for r in stored}) == 1 and one not in stored[0]["content"]
    )  # redacted alike
    assert stored[0]["norm_hash"] == stored[2]["norm_hash"] != stored[1]["norm_hash"]
    # keyed by the database's own 256-bit key: not the hash of the stored text, nor computable without the key
    assert bytes(stored[0]["norm_hash"]) != repeats.norm_hash(stored[0]["content"])
    assert len(repeats.fold_key(conn)) == 32
    check_invariant(conn)


def test_agent_kind_source_importance_and_digits_tell_episodes_apart(conn, memctl_env):
    base = add(conn, ALERT, kind="alert", source="nagios")
    variants = [
        dict(kind="alert", source="nagios", agent="other"),
        dict(kind="observation", source="nagios"),
        dict(kind="alert", source="prometheus"),
        dict(kind="alert"),
        dict(kind="alert", source="nagios", importance=9),
    ]
    for fields in variants:
        assert add(conn, ALERT, **fields).folded_into is None
    assert add(conn, "disk 92% on web-3", kind="alert", source="nagios").folded_into is None
    assert add(conn, "DISK  91% ON WEB-3 ", kind="alert", source="nagios").folded_into == base.id
    assert scalar(conn, "SELECT count(*) FROM episodes WHERE repeat_of IS NULL") == 7
    check_invariant(conn)


def test_the_window_slides_with_each_sighting_and_a_longer_gap_starts_a_new_first(conn, memctl_env):
    configure(memctl_env, '[episodes]\nrepeat_window = "1h"\n')
    times = [
        ago(hours=10),
        ago(hours=9, minutes=10),
        ago(hours=8, minutes=20),
    ]  # 50 minutes apart: one first
    ids = [add(conn, ALERT, created_at=t) for t in times]
    assert ids[0].folded_into is None and ids[1].folded_into == ids[2].folded_into == ids[0].id
    later = add(
        conn, ALERT, created_at=ago(hours=7, minutes=19)
    )  # 61 minutes after the last sighting
    assert later.folded_into is None
    assert add(conn, ALERT, created_at=ago(hours=7)).folded_into == later.id
    assert (
        add(conn, ALERT, created_at=ago(hours=11)).folded_into is None
    )  # before every first: a first itself
    stored = conn.execute(
        "SELECT id, repeats, last_seen_at FROM episodes WHERE repeat_of IS NULL ORDER BY created_at"
    ).fetchall()
    assert [(r["repeats"], r["last_seen_at"]) for r in stored] == [
        (0, None),
        (2, times[2]),
        (1, ago(hours=7)),
    ]
    check_invariant(conn)


def test_fold_off_stores_and_embeds_every_repeat(conn, memctl_env):
    configure(memctl_env, "[episodes]\nfold = false\n")
    assert all(add(conn, ALERT).folded_into is None for _ in range(3))
    assert scalar(conn, "SELECT count(*) FROM chunks") == 3
    assert (
        scalar(conn, "SELECT count(*) FROM episodes WHERE norm_hash IS NOT NULL") == 3
    )  # ready to fold later


def test_episode_add_says_a_repeat_was_folded(cli, conn, memctl_env):
    first = cli("episode", "add", ALERT, "--kind", "alert")
    assert first.exit_code == 0 and first.stderr == ""
    again = cli("episode", "add", ALERT.upper(), "--kind", "alert")
    assert again.exit_code == 0 and again.stdout.strip().isdigit()
    assert (
        f"repeat of episode {first.stdout.strip()}" in again.stderr
        and "not embedded" in again.stderr
    )
    shown = cli("episode", "add", ALERT, "--kind", "alert", "-f", "json")
    assert shown.json()["folded_into"] == int(first.stdout)
    new = cli("episode", "add", "something else", "-f", "json").json()
    assert new["folded_into"] is None and new["id"] > shown.json()["id"]
    detail = cli("episode", "show", first.stdout.strip(), "-f", "json").json()
    assert (detail["repeats"], detail["repeat_of"]) == (2, None) and detail["last_seen_at"]


def test_episode_import_folds_against_the_stored_firsts_and_within_its_own_batches(
    cli, conn, memctl_env, monkeypatch
):
    monkeypatch.setattr(
        episodes, "BATCH", 100
    )  # several COPY batches: repeats across them fold too
    before = add(conn, ALERT, kind="alert", source="nagios", created_at=ago(days=2))
    rows = [
        {
            "content": ALERT,
            "kind": "alert",
            "source": "nagios",
            "created_at": (ago(days=2) + datetime.timedelta(minutes=5 * (i + 1))).isoformat(),
        }
        for i in range(287)
    ]
    rows += [{"content": text, "kind": "alert", "source": "nagios"} for text in DISTINCT]
    rows += [
        {
            "content": "disk 95% on web-3",
            "kind": "alert",
            "source": "nagios",
            "created_at": (ago(hours=1) + datetime.timedelta(minutes=i)).isoformat(),
        }
        for i in range(3)
    ]
    summary = load(cli, rows)
    assert (summary["imported"], summary["folded"], summary["chunks"]) == (300, 289, 11)
    stored = firsts(conn)
    assert stored[ALERT]["id"] == before.id and stored[ALERT]["repeats"] == 287
    assert stored[ALERT]["last_seen_at"] == ago(days=2) + datetime.timedelta(minutes=5 * 287)
    assert stored["disk 95% on web-3"]["repeats"] == 2
    assert scalar(conn, "SELECT count(*) FROM chunks") == 12  # the first alert's, then 11
    check_invariant(conn)


def test_episodes_at_the_first_moment_of_time_fold_without_overflow(cli, conn, memctl_env):
    """The window reaches back from an episode's time: from 0001-01-01 that was before the year 1, which Python
    cannot hold (the long fuzz profile found `episode import` failing with OverflowError there). Now the earliest
    time memctl takes is 1900-01-01 ([limits]), so no window (1000y at most) reaches that far: from the first
    moment the repeats fold, by import and by add, and today's alert, more than the window later, does not."""
    configure(memctl_env, '[episodes]\nrepeat_window = "100y"\n')
    refused = cli(
        "episode", "import", "-", input='{"content": "x", "created_at": "0001-01-01T00:00:00Z"}\n'
    )
    assert refused.exit_code == 2 and "1900" in refused.stderr  # [limits]: nothing imported
    dawn = datetime.datetime(1900, 1, 1, tzinfo=datetime.timezone.utc)
    summary = load(
        cli,
        [
            {"content": ALERT},
            {"content": ALERT, "created_at": "1900-01-01T00:00:00"},
            {"content": ALERT, "created_at": "1900-01-01T00:00:05Z"},
        ],
    )
    assert (summary["imported"], summary["folded"]) == (3, 1)  # today's alert is a first of its own
    assert add(conn, ALERT, created_at=dawn + datetime.timedelta(seconds=9)).folded_into is not None
    stored = conn.execute(
        "SELECT repeats, last_seen_at FROM episodes WHERE repeat_of IS NULL AND created_at = %s",
        (dawn,),
    ).fetchone()
    assert stored == {"repeats": 2, "last_seen_at": dawn + datetime.timedelta(seconds=9)}
    check_invariant(conn)


# --- retention -----------------------------------------------------------------------------------------------


def _alert_over(conn, days: list[float], **fields) -> int:
    ids = [
        add(conn, ALERT, kind="raw", source="nagios", created_at=ago(days=d), **fields)
        for d in days
    ]
    assert all(a.folded_into == ids[0].id for a in ids[1:])
    return ids[0].id


def test_prune_deletes_repeats_by_their_age_and_keeps_the_first_while_one_is_left(
    cli, conn, memctl_env
):
    configure(memctl_env, '[retention]\nraw = "30d"\n\n[episodes]\nrepeat_window = "10d"\n')
    first = _alert_over(conn, [40, 39, 38, 31, 29.5, 29])
    dry = {r["kind"]: r for r in cli("prune", "-f", "json").json()}
    assert dry["raw"]["rows"] == 3  # the three old repeats; the first is seen until 29 days ago
    done = {r["kind"]: r for r in cli("prune", "--yes", "-f", "json").json()}
    assert (done["raw"]["rows"], done["raw"]["remaining"]) == (3, 0)
    row = conn.execute(
        "SELECT repeats, last_seen_at FROM episodes WHERE id = %s", (first,)
    ).fetchone()
    assert (row["repeats"], row["last_seen_at"]) == (2, ago(days=29))
    assert scalar(conn, "SELECT count(*) FROM chunks") == 1
    check_invariant(conn)

    configure(
        memctl_env, '[retention]\nraw = "28d"\n'
    )  # the last sightings age out: the first goes with them
    done = {r["kind"]: r for r in cli("prune", "--yes", "-f", "json").json()}
    assert (done["raw"]["rows"], done["raw"]["remaining"]) == (3, 0)
    assert (
        scalar(conn, "SELECT count(*) FROM episodes")
        == scalar(conn, "SELECT count(*) FROM chunks")
        == 0
    )
    assert cli("jobs", "--job", "prune", "-f", "json").json()[0]["outcome"] == "ok"


def test_purge_takes_a_first_with_its_repeats_and_since_keeps_an_older_first(cli, conn, memctl_env):
    configure(memctl_env, '[episodes]\nrepeat_window = "10d"\n')
    whole = _alert_over(conn, [3, 2.5, 2])
    add(conn, "other source says it too", source="ticket")
    out = cli("purge", "--source", "nagios", "--yes", "-f", "json")
    assert out.exit_code == 0 and out.json()["rows"] == 3 and out.json()["remaining"] == 0
    assert (
        scalar(
            conn, "SELECT count(*) FROM episodes WHERE id = %s OR repeat_of = %s", (whole, whole)
        )
        == 0
    )

    older = _alert_over(conn, [5, 4.5, 1, 0.5])
    out = cli("purge", "--source", "nagios", "--since", "2d", "--yes", "-f", "json")
    assert out.json()["rows"] == 2
    row = conn.execute(
        "SELECT repeats, last_seen_at FROM episodes WHERE id = %s", (older,)
    ).fetchone()
    assert (row["repeats"], row["last_seen_at"]) == (1, ago(days=4.5))
    check_invariant(conn)


def test_episode_delete_takes_a_first_with_its_repeats_and_uncounts_a_repeat(cli, conn, memctl_env):
    first = _alert_over(conn, [3, 2.5, 2, 1.5])
    repeat_ids = [r["id"] for r in episodes.repeats_of(conn, "default", first)[1:]]
    out = cli("episode", "delete", str(repeat_ids[-1]), "-f", "json")
    assert out.exit_code == 0 and [r["deleted"] for r in out.json()] == [repeat_ids[-1]]
    row = conn.execute(
        "SELECT repeats, last_seen_at FROM episodes WHERE id = %s", (first,)
    ).fetchone()
    assert (row["repeats"], row["last_seen_at"]) == (2, ago(days=2))
    check_invariant(conn)
    out = cli("episode", "delete", str(first), "-f", "json")
    assert sorted(r["deleted"] for r in out.json()) == sorted([first, *repeat_ids[:2]])
    assert scalar(conn, "SELECT count(*) FROM episodes") == 0


# --- summaries -----------------------------------------------------------------------------------------------


def test_a_summary_reads_a_repeated_alert_once_with_its_count_and_holds_every_repeat(
    cli, conn, ollama_env, ollama
):
    configure(ollama_env, '[retention]\nraw = "30d"\n\n[summarize]\nmodel = "llama3.2:3b"\n')
    day = datetime.datetime.combine(
        (NOW - datetime.timedelta(days=40)).date(), datetime.time(), datetime.timezone.utc
    )
    for i in range(288):  # a day of the alert, every five minutes
        add(
            conn,
            ALERT,
            kind="raw",
            source="nagios",
            created_at=day + datetime.timedelta(minutes=5 * i),
        )
    add(conn, "Replica lag cleared after vacuum.", kind="raw", source="nagios", created_at=day)
    late = add(
        conn,
        ALERT,
        kind="raw",
        source="nagios",
        created_at=day + datetime.timedelta(days=1, minutes=2),
    )
    out = cli("summarize", "--limit", "1", "-f", "json")  # the first day's window only
    assert out.exit_code == 0, out.stderr
    summary = conn.execute(
        "SELECT id, content, meta FROM episodes WHERE kind = 'summary'"
    ).fetchone()
    lines = [line for line in summary["content"].splitlines() if ALERT in line]
    assert len(lines) == 1 and "(repeated: seen 288 times, first 00:00, last 23:55 UTC)" in lines[0]
    assert (summary["meta"]["sources"], summary["meta"]["repeats"]) == (289, 287)
    assert (
        scalar(conn, "SELECT count(*) FROM summary_sources WHERE summary_id = %s", (summary["id"],))
        == 289
    )
    # The next day's repeat waits for its summary, and keeps its first; then both go.
    pruned = {r["kind"]: r for r in cli("prune", "--yes", "-f", "json").json()}
    assert (
        pruned["raw"]["rows"],
        pruned["raw"]["kept_for_summary"],
        pruned["raw"]["remaining"],
    ) == (288, 1, 0)
    first = firsts(conn)[ALERT]
    assert (first["repeats"], first["last_seen_at"]) == (
        1,
        day + datetime.timedelta(days=1, minutes=2),
    )
    assert late.folded_into == first["id"]
    check_invariant(conn)
    assert cli("summarize").exit_code == 0
    pruned = {r["kind"]: r for r in cli("prune", "--yes", "-f", "json").json()}
    assert (
        pruned["raw"]["rows"] == 2
        and scalar(conn, "SELECT count(*) FROM episodes WHERE kind = 'raw'") == 0
    )


# --- export and import ---------------------------------------------------------------------------------------


def test_export_and_import_round_trip_the_folding(cli, conn, memctl_env):
    configure(memctl_env, '[episodes]\nrepeat_window = "1h"\n')
    first = _alert_over(conn, [1, 0.99, 0.98])
    add(
        conn, ALERT, kind="raw", source="nagios", created_at=ago(days=0.5)
    )  # past the window: a second first
    add(conn, ALERT, kind="raw", source="nagios", created_at=ago(days=0.49))
    add(conn, "incident 7", kind="raw")
    exported = cli("export")
    assert exported.exit_code == 0
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sum(1 for r in lines if r.get("repeat_of") == first) == 2
    before = conn.execute(
        "SELECT content, created_at, repeats, last_seen_at, repeat_of IS NULL AS first "
        "FROM episodes ORDER BY created_at"
    ).fetchall()
    conn.execute(
        "DELETE FROM episodes"
    )  # memory lost, not erased: an erasure would keep the import out
    configure(
        memctl_env, '[episodes]\nrepeat_window = "1d"\n'
    )  # the file's folding wins over this window
    out = cli("import", "-", "-f", "json", input=exported.stdout)
    assert out.exit_code == 0, out.stderr
    assert (out.json()[0]["episodes"], out.json()[0]["folded"], out.json()[0]["chunks"]) == (
        6,
        3,
        3,
    )
    after = conn.execute(
        "SELECT content, created_at, repeats, last_seen_at, repeat_of IS NULL AS first "
        "FROM episodes ORDER BY created_at"
    ).fetchall()
    assert after == before
    again = cli("import", "-", "-f", "json", input=exported.stdout)
    assert (again.json()[0]["episodes"], again.json()[0]["duplicates"]) == (0, 6)
    check_invariant(conn)


def test_an_older_export_without_repeat_of_is_folded_by_the_window(cli, conn, memctl_env):
    add(conn, "seed")
    header = cli("export").stdout.splitlines()[0]
    rows = [
        {
            "type": "episode",
            "id": i + 100,
            "agent": "default",
            "kind": "raw",
            "source": "nagios",
            "importance": 4,
            "created_at": ago(minutes=5 * (10 - i)).isoformat(),
            "meta": {},
            "content": ALERT,
        }
        for i in range(10)
    ]
    out = cli("import", "-", "-f", "json", input="\n".join([header, *map(json.dumps, rows)]) + "\n")
    assert out.exit_code == 0, out.stderr
    assert out.json()[0]["folded"] == 9 and firsts(conn)[ALERT]["repeats"] == 9
    bad = [{**rows[0], "id": 7, "repeat_of": "x", "created_at": NOW.isoformat()}]
    out = cli("import", "-", input="\n".join([header, *map(json.dumps, bad)]) + "\n")
    assert out.exit_code == 2 and "repeat_of" in out.stderr and "line 2" in out.stderr
    check_invariant(conn)


# --- writers at once -----------------------------------------------------------------------------------------


def test_writers_adding_and_importing_the_same_text_at_once_make_one_first(
    db_url, conn, memctl_env
):
    settings = config.load()
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def adder() -> None:
        try:
            with db.connect(db_url) as own:
                start.wait()
                for _ in range(25):  # one time for all: which writer comes first decides nothing
                    episodes.add_episode(
                        own.use_settings(settings), ALERT, kind="alert", created_at=NOW
                    )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def importer() -> None:
        try:
            with db.connect(db_url) as own:
                # each its own time: 25 records at one time would be one record stored once (memctl.write.identity)
                new = [
                    gate.validate(
                        settings,
                        ALERT.upper(),
                        kind="alert",
                        created_at=NOW + datetime.timedelta(microseconds=i),
                    )
                    for i in range(25)
                ]
                start.wait()
                episodes.import_episodes(
                    own.use_settings(settings), iter(new), result=episodes.ImportResult()
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=adder),
        threading.Thread(target=adder),
        threading.Thread(target=importer),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert scalar(conn, "SELECT count(*) FROM episodes") == 75
    assert [r["repeats"] for r in firsts(conn).values()] == [74]
    assert scalar(conn, "SELECT count(*) FROM chunks") == 1
    check_invariant(conn)
