"""Facts in two timelines: valid time (--valid-from, --as-of) beside system time (changed_at); docs/facts.md."""

from __future__ import annotations

import datetime
import json
import shutil

import pytest

from memctl import db
from memctl.errors import BadValue, NotFound
from memctl.records import facts
from memctl.write.values import WRITER  # rows planted on purpose pass the writer check

UTC = datetime.timezone.utc
MON, TUE, WED, THU = (
    "2026-08-10T00:00:00Z",
    "2026-08-11T03:10:00Z",
    "2026-08-12T12:00:00Z",
    "2026-08-13T00:00:00Z",
)


def ok(result):
    assert result.exit_code == 0, result.stderr
    return result


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def get(cli, key, *args):
    result = cli("fact", "get", key, *args)
    return result.stdout.strip() if result.exit_code == 0 else result.exit_code


def test_get_as_of_answers_the_value_valid_at_each_moment(cli):
    ok(cli("fact", "set", "db.host", "10.0.0.1", "--valid-from", "2026-01-01T00:00:00Z"))
    ok(
        cli("fact", "set", "db.host", "10.0.0.2", "--valid-from", "2026-03-01")
    )  # a date: midnight UTC
    ok(cli("fact", "set", "db.host", "10.0.0.3"))  # valid from now
    assert get(cli, "db.host", "--as-of", "2025-12-31T23:59:59Z") == 4  # nothing was true yet
    assert (
        get(cli, "db.host", "--as-of", "2026-01-01T00:00:00Z") == "10.0.0.1"
    )  # valid_from is inclusive
    assert get(cli, "db.host", "--as-of", "2026-02-28T23:59:59+00:00") == "10.0.0.1"
    assert (
        get(cli, "db.host", "--as-of", "2026-03-01T01:00:00+01:00") == "10.0.0.2"
    )  # zones honoured: 00:00Z
    assert get(cli, "db.host", "--as-of", "2026-02-28T23:30:00-01:00") == "10.0.0.2"  # 00:30Z
    assert get(cli, "db.host", "--as-of", "2026-03-01") == "10.0.0.2"
    assert (
        get(cli, "db.host", "--as-of", "1000d") == 4
    )  # a duration back from now, as --since takes it
    assert get(cli, "db.host", "--as-of", "0s") == get(cli, "db.host") == "10.0.0.3"
    row = ok(cli("fact", "get", "db.host", "--as-of", "2026-02-01", "-f", "json")).json()
    assert (row["value"], row["version"]) == ("10.0.0.1", 1)
    assert at(row["valid_from"]) == at("2026-01-01T00:00:00Z") and at(row["updated_at"]) > at(
        row["valid_from"]
    )
    missing = cli("fact", "get", "db.host", "--as-of", "2025-01-01")
    assert missing.exit_code == 4 and missing.stdout == "" and "as of 2025-01-01" in missing.stderr


def test_learned_on_friday_that_the_switch_happened_on_wednesday(cli, conn):
    ok(cli("fact", "set", "db.host", "10.8.0.4", "--valid-from", MON))
    ok(cli("fact", "set", "db.host", "10.8.0.5", "--valid-from", WED, "--source", "ops:friday"))
    assert get(cli, "db.host", "--as-of", TUE) == "10.8.0.4"  # what it was when the incident began
    assert get(cli, "db.host", "--as-of", THU) == "10.8.0.5"
    assert get(cli, "db.host") == "10.8.0.5"
    history = ok(cli("fact", "history", "db.host", "-f", "json")).json()
    assert [(h["new_value"], at(h["valid_from"])) for h in history] == [
        ("10.8.0.4", at(MON)),
        ("10.8.0.5", at(WED)),
    ]
    assert all(
        at(h["changed_at"]) > at(h["valid_from"]) for h in history
    )  # recorded now, true since then
    table = ok(cli("fact", "history", "db.host")).stdout
    assert "valid_from" in table and "changed_at" in table


def test_a_back_dated_correction_is_history_not_the_current_value(cli, conn):
    ok(cli("fact", "set", "db.port", "5433"))
    late = cli(
        "fact", "set", "db.port", "5432", "--valid-from", "2026-01-01T00:00:00Z", "-f", "json"
    )
    assert late.exit_code == 0, late.stderr
    assert (
        "version 2 recorded as valid from 2026-01-01" in late.stderr
        and "stays '5433'" in late.stderr
    )
    assert late.json()[0]["current_value"] == "5433" and late.json()[0]["new_value"] == "5432"
    table = cli(
        "fact", "set", "db.port", "5430", "--valid-from", "2025-12-01T00:00:00Z"
    ).stdout.splitlines()
    assert (
        table[0].split()[-1] == "current_value" and table[2].split()[-1] == "5433"
    )  # what `fact get` answers
    assert get(cli, "db.port") == "5433" and get(cli, "db.port", "--as-of", "2026-02-01") == "5432"
    row = conn.execute("SELECT value, version FROM facts WHERE key = 'db.port'").fetchone()
    assert (row["value"], row["version"]) == ("5433", 1)
    change = facts.set_fact(conn, "db.port", "5431", valid_from="2026-06-01T00:00:00Z")
    assert (change.current, change.version, change.old_value, change.current_value) == (
        False,
        4,
        "5433",
        "5433",
    )
    assert facts.get_fact(conn, "db.port", as_of="2026-07-01").value == "5431"
    assert (
        facts.set_fact(conn, "db.port", "5434").current is True
    )  # a plain set is always the latest valid
    assert facts.get_fact(conn, "db.port").version == 5
    assert cli("fact", "set", "db.port", "5435", "-f", "json").json()[0]["current_value"] == "5435"


def test_a_later_recorded_version_wins_a_tie_of_valid_from(cli, conn):
    ok(cli("fact", "set", "svc.owner", "alice", "--valid-from", MON))
    ok(
        cli("fact", "set", "svc.owner", "bob", "--valid-from", MON)
    )  # a correction of the same moment
    assert get(cli, "svc.owner") == "bob" and get(cli, "svc.owner", "--as-of", TUE) == "bob"


def test_current_value_equals_the_value_valid_now(cli, conn):
    for value, when in (("a", WED), ("b", MON), ("c", None), ("d", TUE)):
        facts.set_fact(conn, "k", value, valid_from=when)
    now = datetime.datetime.now(UTC)
    assert facts.get_fact(conn, "k").value == facts.get_fact(conn, "k", as_of=now).value == "c"
    assert [f.value for f in facts.list_facts(conn)] == [
        f.value for f in facts.list_facts(conn, as_of=now)
    ]


@pytest.mark.parametrize("value", ["2999-01-01T00:00:00Z", "next tuesday", "-3d", "2026-13-01"])
def test_a_future_or_malformed_valid_from_exits_2_naming_the_option(cli, conn, value):
    result = cli("fact", "set", "k", "v", "--valid-from", value)
    assert (
        result.exit_code == 2
        and "--valid-from" in result.stderr
        and "Traceback" not in result.stderr
    )
    if value.startswith("2999"):
        assert "in the future" in result.stderr and "scheduled" in result.stderr
    assert conn.execute("SELECT count(*) AS n FROM fact_history").fetchone()["n"] == 0
    with pytest.raises(BadValue):
        facts.set_fact(conn, "k", "v", valid_from="2999-01-01T00:00:00Z")


def test_a_malformed_as_of_exits_2_naming_the_option(cli):
    ok(cli("fact", "set", "k", "v"))
    for args in (["fact", "get", "k"], ["fact", "list"], ["recall", "k"]):
        result = cli(*args, "--as-of", "last tuesday")
        assert result.exit_code == 2 and "--as-of" in result.stderr, (args, result.stderr)


def test_delete_is_a_version_and_earlier_times_still_answer(cli, conn):
    ok(cli("fact", "set", "web.host", "web1", "--valid-from", MON))
    ok(cli("fact", "delete", "web.host"))
    assert get(cli, "web.host") == 4 and get(cli, "web.host", "--as-of", "0s") == 4
    assert get(cli, "web.host", "--as-of", TUE) == "web1"
    assert [f["key"] for f in ok(cli("fact", "list", "--as-of", TUE, "-f", "json")).json()] == [
        "web.host"
    ]
    assert ok(cli("fact", "list", "-f", "json")).json() == []
    history = ok(cli("fact", "history", "web.host", "-f", "json")).json()
    assert history[-1]["op"] == "delete" and history[-1]["valid_from"] == history[-1]["changed_at"]
    # a back-dated value recorded after the deletion does not bring the key back
    change = facts.set_fact(conn, "web.host", "web0", valid_from="2026-08-01T00:00:00Z")
    assert change.current is False and get(cli, "web.host") == 4
    assert get(cli, "web.host", "--as-of", "2026-08-05") == "web0"
    assert (
        "stays deleted"
        in cli("fact", "set", "web.host", "web-1", "--valid-from", "2026-07-01").stderr
    )


def test_erase_still_erases_every_version_at_every_time(cli, conn):
    ok(cli("fact", "set", "ops.note", "hunter2", "--valid-from", MON))
    ok(cli("fact", "set", "ops.note", "hunter3", "--valid-from", WED))
    ok(cli("fact", "set", "ops.note", "hunter4"))
    ok(cli("fact", "delete", "ops.note", "--erase"))
    for when in (TUE, THU, "0s"):
        assert get(cli, "ops.note", "--as-of", when) == 4
    assert ok(cli("fact", "list", "--as-of", THU, "-f", "json")).json() == []
    stored = json.dumps(conn.execute("SELECT old_value, new_value FROM fact_history").fetchall())
    assert "hunter" not in stored
    ok(cli("fact", "set", "ops.note", "fresh"))  # a new timeline after the erasure
    assert get(cli, "ops.note") == "fresh" and get(cli, "ops.note", "--as-of", THU) == 4


def test_list_as_of_with_prefix_and_namespaces(cli):
    ok(cli("fact", "set", "db.host", "old", "--valid-from", MON))
    ok(cli("fact", "set", "db.host", "new", "--valid-from", WED))
    ok(cli("fact", "set", "db.port", "5432", "--valid-from", WED))
    ok(cli("fact", "set", "web.host", "w1", "--valid-from", MON))
    ok(cli("fact", "set", "db.host", "staging-old", "-n", "staging", "--valid-from", MON))
    rows = ok(cli("fact", "list", "--as-of", TUE, "--prefix", "db.", "-f", "json")).json()
    assert [(r["key"], r["value"]) for r in rows] == [("db.host", "old")]
    rows = ok(cli("fact", "list", "--as-of", THU, "--all-namespaces", "-f", "json")).json()
    assert [(r["namespace"], r["key"], r["value"]) for r in rows] == [
        ("default", "db.host", "new"),
        ("default", "db.port", "5432"),
        ("default", "web.host", "w1"),
        ("staging", "db.host", "staging-old"),
    ]
    assert "valid_from" in ok(cli("fact", "list")).stdout


def test_recall_as_of_builds_the_context_of_that_time(cli, conn):
    ok(cli("fact", "set", "db.host", "10.8.0.4", "--valid-from", MON))
    ok(cli("fact", "set", "db.host", "10.8.0.5", "--valid-from", WED))
    before = int(
        ok(
            cli(
                "episode",
                "add",
                "db host migration planned for wednesday",
                "--created-at",
                "2026-08-10T12:00:00Z",
            )
        ).stdout
    )
    after = int(
        ok(cli("episode", "add", "db host moved to the new rack", "--created-at", WED)).stdout
    )
    then = ok(cli("recall", "db host", "--as-of", TUE, "-f", "json")).json()
    assert [(i["kind"], i.get("value"), i.get("id")) for i in then["items"]] == [
        ("fact", "10.8.0.4", None),
        ("episode", None, before),
    ]
    assert "15 hours ago" in then["items"][1]["text"]  # ages count back from the time asked about
    assert (
        conn.execute("SELECT count(*) AS n FROM episode_access").fetchone()["n"] == 0
    )  # no access counted
    now = ok(cli("recall", "db host", "-f", "json")).json()
    assert ("fact", "10.8.0.5") in [(i["kind"], i.get("value")) for i in now["items"]]
    assert after in [
        e for i in now["items"] for e in ([i["id"]] if i["kind"] == "episode" else i.get("ids", []))
    ]
    text = ok(cli("recall", "db host", "--as-of", TUE)).stdout
    assert "db.host = 10.8.0.4" in text and "moved" not in text


def test_export_import_carries_valid_time_and_reads_older_files(cli, conn, db_url, empty_db_url):
    ok(cli("fact", "set", "db.host", "10.8.0.4", "--valid-from", MON))
    ok(cli("fact", "set", "db.host", "10.8.0.5"))
    ok(cli("fact", "set", "db.host", "10.8.0.3", "--valid-from", TUE))  # back-dated: history only
    ok(cli("fact", "set", "web.host", "web1"))
    exported = ok(cli("export")).stdout
    record = next(json.loads(x) for x in exported.splitlines() if '"key":"db.host"' in x)
    assert [("valid_from" in h) for h in record["history"]] == [True, False, True]
    assert "valid_from" not in record  # the current version became true when it was recorded
    with db.connect(empty_db_url) as other:
        from memctl.db import migrate

        migrate.apply(other)
    env = {"MEMCTL_DATABASE_URL": empty_db_url}
    ok(cli("import", "-", input=exported, env=env))
    for when in (TUE, THU, "0s"):
        assert (
            get(cli, "db.host", "--as-of", when)
            == cli("fact", "get", "db.host", "--as-of", when, env=env).stdout.strip()
        )
    assert cli("fact", "get", "db.host", "--as-of", TUE, env=env).stdout.strip() == "10.8.0.3"
    assert cli("fact", "get", "db.host", env=env).stdout.strip() == "10.8.0.5"
    again = ok(cli("export", env=env)).stdout
    facts_of = lambda text: [x for x in text.splitlines() if '"type":"fact"' in x]  # noqa: E731
    assert facts_of(again) == facts_of(exported)
    # a file written before valid time: each version became true when it was recorded
    old = [
        exported.splitlines()[0],
        json.dumps(
            {
                "type": "fact",
                "namespace": "old",
                "key": "k",
                "value": "v2",
                "source": None,
                "version": 2,
                "updated_at": "2026-08-12T00:00:00+00:00",
                "history": [
                    {
                        "version": 1,
                        "op": "set",
                        "old_value": None,
                        "new_value": "v1",
                        "source": None,
                        "changed_at": "2026-08-10T00:00:00+00:00",
                    },
                    {
                        "version": 2,
                        "op": "set",
                        "old_value": "v1",
                        "new_value": "v2",
                        "source": None,
                        "changed_at": "2026-08-12T00:00:00+00:00",
                    },
                ],
            }
        ),
    ]
    ok(cli("import", "-", input="\n".join(old) + "\n"))
    history = ok(cli("fact", "history", "k", "-n", "old", "-f", "json")).json()
    assert all(h["valid_from"] == h["changed_at"] for h in history)
    assert get(cli, "k", "-n", "old", "--as-of", TUE) == "v1" and get(cli, "k", "-n", "old") == "v2"


def test_import_refuses_a_version_true_after_it_was_recorded(cli, conn):
    header = json.dumps({"type": "header", "format": 1})
    fact = {
        "type": "fact",
        "namespace": "default",
        "key": "k",
        "value": "v",
        "source": None,
        "version": 1,
        "history": [
            {
                "version": 1,
                "op": "set",
                "old_value": None,
                "new_value": "v",
                "source": None,
                "changed_at": MON,
                "valid_from": WED,
            }
        ],
    }
    result = cli("import", "-", input=header + "\n" + json.dumps(fact) + "\n")
    assert result.exit_code == 2 and "line 2" in result.stderr and "valid_from" in result.stderr
    assert conn.execute("SELECT count(*) AS n FROM fact_history").fetchone()["n"] == 0


def test_fact_export_and_import_keep_valid_from(cli, empty_db_url, tmp_path):
    ok(cli("fact", "set", "db.host", "10.8.0.4", "--valid-from", MON))
    exported = ok(cli("fact", "export")).jsonl()
    assert at(exported[0]["valid_from"]) == at(MON)
    with db.connect(empty_db_url) as other:
        from memctl.db import migrate

        migrate.apply(other)
    env = {"MEMCTL_DATABASE_URL": empty_db_url}
    ok(cli("fact", "import", "-", input=json.dumps(exported[0]) + "\n", env=env))
    assert cli("fact", "get", "db.host", "--as-of", TUE, env=env).stdout.strip() == "10.8.0.4"
    future = cli(
        "fact",
        "import",
        "-",
        input='{"key": "k", "value": "v", "valid_from": "2999-01-01"}\n',
        env=env,
    )
    assert future.exit_code == 2 and "line 1" in future.stderr and "in the future" in future.stderr


def test_mcp_fact_get_takes_as_of(db_url):
    from memctl import config
    from memctl.errors import UsageError
    from memctl.mcp import sessions, tools

    session = sessions.Session(config.load(), sessions.Scope.make(), lambda: db.connect(db_url))
    with session.connection() as conn:
        facts.set_fact(conn, "db.host", "10.8.0.4", valid_from=MON)
        facts.set_fact(conn, "db.host", "10.8.0.5", valid_from=WED)
    assert tools.fact_get(session, "db.host", as_of=TUE).text == "10.8.0.4"
    assert tools.fact_get(session, "db.host").text == "10.8.0.5"
    with pytest.raises(NotFound):
        tools.fact_get(session, "db.host", as_of="2026-01-01")
    with pytest.raises(UsageError):
        tools.fact_get(session, "db.host", as_of="last week")
    lines = tools.fact_history(session, "db.host").text.splitlines()
    assert len(lines) == 2 and all("(valid from " in line for line in lines)


def test_the_migration_gives_existing_versions_their_recorded_time(empty_db_url, tmp_path):
    from memctl.db import migrate

    older = tmp_path / "sql"
    older.mkdir()
    for m in migrate.read_files():
        if m.name < "0012":
            shutil.copy(m.path, older / m.name)
    with db.connect(empty_db_url) as conn:
        migrate.apply(conn, older)
        conn.execute(
            WRITER
            + "INSERT INTO fact_history (namespace, key, version, op, new_value, changed_at) "
            "VALUES ('default', 'k', 1, 'set', 'v1', '2026-08-10T00:00:00Z'), "
            "('default', 'k', 2, 'set', 'v2', '2026-08-12T00:00:00Z')"
        )
        conn.execute(
            WRITER + "INSERT INTO facts (namespace, key, value, version, updated_at) "
            "VALUES ('default', 'k', 'v2', 2, '2026-08-12T00:00:00.5Z')"
        )
        assert "0012_facts_valid_time.sql" in [m.name for m in migrate.apply(conn)]
        rows = conn.execute("SELECT valid_from = changed_at AS same FROM fact_history").fetchall()
        assert [r["same"] for r in rows] == [True, True]
        current = facts.get_fact(conn, "k")
        assert current.valid_from == datetime.datetime(
            2026, 8, 12, tzinfo=UTC
        )  # its version's, not updated_at
        assert facts.get_fact(conn, "k", as_of=TUE).value == "v1"
