"""memctl export / import carry each episode's record_key (docs/ingest.md "A record stored once"): a database
filled by `memctl import` recognises the records of the log file the exporting database had imported."""

from __future__ import annotations

import datetime
import json

import pytest

from tests.fix_transfer import counts, records
from tests.installed import start_ingest

START = datetime.datetime(2026, 11, 2, 8, 0, tzinfo=datetime.timezone.utc)


def log_file(tmp_path):
    """A log as `episode import` reads it: timed records from two agents whose texts recur (folded as repeats),
    and untimed ones (told by their occurrence), one of them twice."""
    lines = [
        {
            "content": f"cron job {i % 12} finished on web{i % 3}",
            "agent": f"agent{i % 2}",
            "source": "cron" if i % 3 else None,
            "created_at": (START + datetime.timedelta(minutes=i)).isoformat(),
        }
        for i in range(60)
    ]
    lines += [
        {"content": "disk check ok", "source": "checks"},
        {"content": "backup started"},
        {"content": "disk check ok", "source": "checks"},
    ]
    path = tmp_path / "app.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, len(lines)


def keyed(url: str) -> list[tuple]:
    """Every episode's identity as stored: (agent, record_key hex, a repeat or not, content, source)."""
    from memctl import db

    with db.connect(url) as conn:
        rows = conn.execute(
            "SELECT agent, encode(record_key, 'hex') AS k, repeat_of IS NOT NULL AS repeat, content,"
            " source FROM episodes ORDER BY agent, record_key"
        ).fetchall()
    return [tuple(r.values()) for r in rows]


def test_export_then_import_keeps_the_keys_so_the_log_imported_again_stores_nothing(
    cli, db_url, other_db, tmp_path
):
    path, n = log_file(tmp_path)
    first = cli("episode", "import", str(path), "-f", "json").json()[0]
    assert (first["imported"], first["already_stored"]) == (n, 0) and first["folded"] > 0
    here = keyed(db_url)
    assert all(k is not None and len(k) == 32 for _, k, _, _, _ in here)
    assert any(repeat for _, _, repeat, _, _ in here)  # repeats carry their keys too
    export = cli("export").stdout
    env = {"MEMCTL_DATABASE_URL": other_db}
    loaded = cli("import", "-", "-f", "json", input=export, env=env)
    assert loaded.exit_code == 0, loaded.stderr
    again = cli(
        "episode", "import", str(path), "-f", "json", env=env
    )  # the nightly import, on the new server
    assert again.exit_code == 0, again.stderr
    assert (again.json()[0]["imported"], again.json()[0]["already_stored"]) == (0, n)
    assert (
        loaded.json()[0]["episodes"] == n
    )  # the untimed line read twice: two records (their keys), not one
    assert counts(other_db)["episodes"] == n
    assert keyed(other_db) == here  # the same keys, on the same records, repeats as repeats
    assert sorted((r["agent"], r["record_key"]) for r in records(export, "episode")) == sorted(
        (a, k) for a, k, _, _, _ in here
    )
    twice = cli("import", "-", "-f", "json", input=export, env=env).json()[
        0
    ]  # memctl import's own dedup holds
    assert (twice["episodes"], twice["duplicates"]) == (0, n)


def test_an_export_of_an_ingested_journal_then_the_journal_ingested_again_stores_nothing(
    cli, memctl_env, other_db
):
    data = "".join(
        json.dumps(
            {
                "__CURSOR": f"s=ab;i={i:x}",
                "__REALTIME_TIMESTAMP": str(1764662400000000 + i),
                "_SYSTEMD_UNIT": f"u{i % 2}.service",
                "MESSAGE": f"tick {i % 3}",
            }
        )
        + "\n"
        for i in range(12)
    ).encode()

    def ingest(env):
        proc = start_ingest(env, "--format", "journal")
        _, err = proc.communicate(data, timeout=60)
        assert proc.returncode == 0, err
        return err.decode()

    assert "stored 12 " in ingest(memctl_env)
    export = cli("export").stdout
    assert all(r["record_key"] for r in records(export, "episode"))
    env = {"MEMCTL_DATABASE_URL": other_db}
    assert cli("import", "-", "-f", "json", input=export, env=env).json()[0]["episodes"] == 12
    assert "stored 0 " in ingest({**memctl_env, **env}) and counts(other_db)["episodes"] == 12


def test_a_key_already_stored_here_is_an_episode_already_here(cli, db_url, other_db, tmp_path):
    """The target imported the log itself (its untimed records at its own time): the export's copies of those
    records are duplicates by their key, not a unique-index error, and not stored twice."""
    path, n = log_file(tmp_path)
    assert cli("episode", "import", str(path)).exit_code == 0
    export = cli("export").stdout
    env = {"MEMCTL_DATABASE_URL": other_db}
    assert cli("episode", "import", str(path), env=env).exit_code == 0
    loaded = cli("import", "-", "-f", "json", input=export, env=env)
    assert loaded.exit_code == 0, loaded.stderr
    assert (loaded.json()[0]["episodes"], loaded.json()[0]["duplicates"]) == (0, n)
    assert counts(other_db)["episodes"] == n
    lines = export.splitlines()
    episode = json.loads(lines[-1])
    assert episode["type"] == "episode"
    # another text under a key this agent already has, then twice under a new key: one record each time
    taken = {
        **episode,
        "id": 10**9,
        "content": "another text",
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    new = [
        {
            **episode,
            "id": 10**9 + i,
            "content": f"text {i}",
            "created_at": "2026-01-02T00:00:00+00:00",
            "record_key": "ab" * 16,
        }
        for i in (1, 2)
    ]
    data = "\n".join([lines[0], *map(json.dumps, [taken, *new])]) + "\n"
    result = cli("import", "-", "-f", "json", input=data, env=env)
    assert result.exit_code == 0, result.stderr
    assert (result.json()[0]["episodes"], result.json()[0]["duplicates"]) == (1, 2)
    assert [c for _, k, _, c, _ in keyed(other_db) if k == "ab" * 16] == ["text 1"]


@pytest.mark.parametrize(
    "bad",
    ["ab" * 15, "ab" * 17, "zz" * 16, " " + "a" * 31, "a" * 31 + "\n", 12345, ["ab" * 16], True],
)
def test_a_malformed_record_key_is_refused_naming_the_line_and_the_field(cli, other_db, bad):
    assert cli("episode", "add", "first", "--created-at", "2026-08-01T00:00:00Z").exit_code == 0
    lines = cli("export").stdout.splitlines()
    episode = {**json.loads(lines[-1]), "record_key": bad}
    data = (
        "\n".join(
            [
                lines[0],
                json.dumps({**episode, "id": 5, "content": "fine", "record_key": None}),
                json.dumps(episode),
            ]
        )
        + "\n"
    )
    result = cli("import", "-", input=data, env={"MEMCTL_DATABASE_URL": other_db})
    assert result.exit_code == 2 and "line 3" in result.stderr and "record_key" in result.stderr, (
        result.stderr
    )
    assert counts(other_db)["episodes"] == 0


def test_an_export_written_before_keys_still_imports(cli, db_url, other_db, tmp_path):
    path, n = log_file(tmp_path)
    assert cli("episode", "import", str(path)).exit_code == 0
    old = [
        {k: v for k, v in json.loads(line).items() if k != "record_key"}
        for line in cli("export").stdout.splitlines()
    ]
    env = {"MEMCTL_DATABASE_URL": other_db}
    result = cli(
        "import", "-", "-f", "json", input="".join(json.dumps(r) + "\n" for r in old), env=env
    )
    assert result.exit_code == 0, result.stderr
    # as before keys: the untimed line read twice (one agent, text and time) is one episode, nothing tells them apart
    assert result.json()[0]["episodes"] == n - 1 and all(
        k is None for _, k, _, _, _ in keyed(other_db)
    )
    again = cli(
        "import", "-", "-f", "json", input="".join(json.dumps(r) + "\n" for r in old), env=env
    ).json()[0]
    assert (again["episodes"], again["duplicates"]) == (0, n)


def test_a_record_key_in_capitals_is_the_same_key(cli, db_url, other_db):
    assert (
        cli(
            "episode",
            "import",
            "-",
            input=json.dumps({"content": "x", "created_at": "2026-08-01T00:00:00Z"}) + "\n",
        ).exit_code
        == 0
    )
    lines = cli("export").stdout.splitlines()
    episode = json.loads(lines[-1])
    data = (
        "\n".join([lines[0], json.dumps({**episode, "record_key": episode["record_key"].upper()})])
        + "\n"
    )
    env = {"MEMCTL_DATABASE_URL": other_db}
    assert cli("import", "-", input=data, env=env).exit_code == 0
    assert keyed(other_db)[0][1] == episode["record_key"]
