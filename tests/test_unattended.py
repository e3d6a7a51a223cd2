"""Unattended for a year (issue 50): what runs with no one watching keeps going, says what it skipped, never
drives a terminal, never pages for nothing, and reads stdin, times and batches by one rule each (README)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ESC = (
    "\x1b]0;pwned\x07",
    "\x1b[2J",
    "\x9b31m",
    "\x7f",
    "\r",
)  # a title, a clear, a C1 CSI, DEL, a carriage return
RAW = {"\x1b", "\x07", "\x9b", "\x7f", "\r"}


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    return str(beside)


def count(conn, query="SELECT count(*) AS n FROM episodes", params=None) -> int:
    return conn.execute(query, params).fetchone()["n"]


# --- ingest goes on ------------------------------------------------------------------------------------------


def test_ingest_skips_a_record_from_a_blocked_source_and_stores_the_rest_of_its_batch(
    cli, conn, tmp_path
):
    assert cli("source", "block", "spam", "--reason", "scraper").exit_code == 0
    lines = [
        {"content": "before", "source": "app"},
        {"content": "refused", "source": "spam"},
        {"content": "same batch", "source": "app"},
        {"content": "after", "source": "app"},
    ]
    data = "".join(json.dumps(x) + "\n" for x in lines)
    cursor = tmp_path / "app.cursor"
    out = cli("ingest", "-f", "jsonl", "--cursor-file", str(cursor), str(_file(tmp_path, data)))
    assert out.exit_code == 0, out.stderr
    assert "line 2: source 'spam' is blocked" in out.stderr and "skipped 1" in out.stderr
    stored = [r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id")]
    assert stored == ["before", "same batch", "after"]
    again = cli("ingest", "-f", "jsonl", "--cursor-file", str(cursor), str(tmp_path / "log.jsonl"))
    assert again.exit_code == 0, (
        again.stderr
    )  # a rerun resumes after it: no crash loop under Restart=
    assert count(conn) == 3


def _file(tmp_path, data: str) -> Path:
    path = tmp_path / "log.jsonl"
    path.write_text(data)
    return path


def test_ingest_a_source_blocked_while_its_batch_is_written_refuses_that_source_alone(
    conn, memctl_env, monkeypatch
):
    """The gate's late check refuses a batch whole when a source is blocked as it commits: ingest runs the batch
    again, and the gate then refuses that source's records alone."""
    from memctl import config
    from memctl.ingest import ingest
    from memctl.write import gate
    from memctl.write.values import WRITER

    settings = config.load()
    conn.use_settings(settings)
    reader = ingest.LineReader(os.open(os.devnull, os.O_RDONLY))
    skipped: list = []
    run = ingest.Ingest(
        conn, reader, ingest.Options("jsonl"), report=lambda n, why: skipped.append(n)
    )
    records = [
        gate.validate(
            settings,
            f"line {i}",
            source="late" if i == 2 else "app",
            created_at="2026-08-11T09:30:00Z",
        )
        for i in range(1, 4)
    ]
    for number, record in enumerate(records, start=1):
        record.line = number
    confirm, blocked = gate.Gate.confirm, []

    def block_then_confirm(self):
        if not blocked:  # `memctl source block late` commits while the batch's transaction is open
            blocked.append(True)
            with psycopg_connect(memctl_env) as other:
                other.execute(f"INSERT INTO blocked_sources (source) VALUES ('late') {WRITER}")
        return confirm(self)

    monkeypatch.setattr(gate.Gate, "confirm", block_then_confirm)
    run.pending.records = records
    run.flush()
    assert skipped == [2] and run.counts.stored == 2
    assert [r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id")] == [
        "line 1",
        "line 3",
    ]


def psycopg_connect(env):
    from memctl import db

    return db.connect(
        env["MEMCTL_DATABASE_URL"]
    )  # declares the schema (sql/0025), as any memctl session does


@pytest.mark.parametrize(
    "data,code",
    [
        ('{"content": "a", "source": "spam"}\n', 1),  # every record refused by the gate: its code
        ("not json\n{broken\n", 2),  # every line unreadable: a wrong --format, say
    ],
)
def test_ingest_exits_non_zero_only_when_every_record_was_skipped(cli, conn, tmp_path, data, code):
    cli("source", "block", "spam")
    out = cli("ingest", "-f", "jsonl", str(_file(tmp_path, data)))
    assert out.exit_code == code, out.stderr
    mixed = cli("ingest", "-f", "jsonl", str(_file(tmp_path, data + '{"content": "kept"}\n')))
    assert mixed.exit_code == 0, mixed.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["ingest"],
        ["episode", "import"],
        ["fact", "import"],
        ["import"],
        ["episode", "search", "--batch"],
    ],
    ids=" ".join,
)
def test_a_directory_given_to_read_exits_2_without_a_traceback(
    memctl_bin, memctl_env, tmp_path, argv
):
    out = memctl_bin(*argv, str(tmp_path), env=memctl_env)
    assert out.exit_code == 2 and "is a directory" in out.stderr and "Traceback" not in out.stderr


# --- a reader that stops early -------------------------------------------------------------------------------


def test_a_reader_that_stops_early_is_no_failed_job(cli, conn, memctl_env):
    cli(
        "episode",
        "import",
        "-",
        input="".join(
            json.dumps({"content": f"episode {i} " + "x" * 200}) + "\n" for i in range(2000)
        ),
    )
    env = dict(os.environ, **memctl_env)
    for _ in range(3):  # the shipped alert's threshold: three failures in a row
        done = subprocess.run(
            f"'{_memctl()}' export | head -1", shell=True, env=env, capture_output=True, timeout=120
        )
        assert (
            done.returncode == 0
            and done.stdout.startswith(b'{"type":"header"')
            and b"Traceback" not in done.stderr
        )
    outcomes = [r["outcome"] for r in conn.execute("SELECT outcome FROM jobs WHERE job = 'export'")]
    assert outcomes == ["interrupted"] * 3
    metrics = cli("metrics").stdout
    assert 'memctl_job_consecutive_failures{job_name="export"} 0.0' in metrics


# --- output is inert -----------------------------------------------------------------------------------------

HUMAN = {  # every human-facing output that shows stored text: its argv after the setup
    "episode list": ["episode", "list"],
    "episode search": ["episode", "search", "disk alert"],
    "episode show": ["episode", "show", "1"],
    "recall": ["recall", "disk alert on web1"],
    "fact list": ["fact", "list"],
    "fact history": ["fact", "history", "motd"],
}


@pytest.mark.parametrize("name", HUMAN)
def test_stored_control_characters_are_escaped_in_human_output_and_exact_in_json(cli, name):
    text = "disk alert on web1 " + " ".join(ESC) + " cleared"
    assert cli("episode", "add", "-", input=text).exit_code == 0
    assert cli("fact", "set", "motd", "-", input=text).exit_code == 0
    out = cli(*HUMAN[name])
    assert out.exit_code == 0, out.stderr
    assert not RAW & set(out.stdout), repr(out.stdout)
    assert "\\x1b]0;pwned\\x07" in out.stdout
    if name != "recall":
        assert text in _strings(cli(*HUMAN[name], "-f", "json").json())  # JSON stays exact


def _strings(value) -> set:
    if isinstance(value, str):
        return {value}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return set().union(*(_strings(v) for v in items)) if items else set()


def test_error_messages_escape_control_characters_and_redact_what_they_quote(cli):
    key = "-----BEGIN OPENSSH PRIVATE KEY-----"
    for args in (
        ["episode", "add", f"{key} b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"],
        ["--bogus", f"{key} x"],
        ["episode", "add", "x", "--importance", f"{key} x"],
        ["episode", "add", "x", f"{key} extra"],
    ):
        out = cli(*args)
        assert out.exit_code == 2, (args, out.stderr)
        assert "PRIVATE KEY" not in out.stdout + out.stderr, out.stderr
    out = cli("episode", "add", "x", "--importance", "\x1b[2J")
    assert out.exit_code == 2 and "\x1b" not in out.stderr and "\\x1b[2J" in out.stderr


# --- one rule for stdin ---------------------------------------------------------------------------------------

STDIN_TEXT = {  # a command reading a text from stdin, and how to read back what it stored or ran
    "fact set": (["fact", "set", "db.host", "-"], ["fact", "get", "db.host"]),
    "episode add": (["episode", "add", "-"], ["episode", "list", "-f", "jsonl"]),
}
STDIN_TEXTS = [
    ["fact", "set", "k", "-"],
    ["episode", "add", "-"],
    ["episode", "search", "-"],
    ["recall", "-"],
]
STDIN_STREAMS = [
    ["episode", "import", "-"],
    ["fact", "import", "-"],
    ["import", "-"],
    ["ingest"],
    ["episode", "search", "--batch", "-"],
    ["recall", "--batch", "-", "-f", "jsonl"],
]
EMPTY = [(argv, "") for argv in STDIN_TEXTS + STDIN_STREAMS] + [
    (argv, "\n") for argv in STDIN_TEXTS
]


@pytest.mark.parametrize("name", STDIN_TEXT)
def test_a_single_trailing_newline_from_stdin_is_no_part_of_the_value(cli, name):
    write, read = STDIN_TEXT[name]
    assert cli(*write, input="10.0.0.1\n").exit_code == 0
    out = cli(*read).stdout
    assert "10.0.0.1\n" == out if name == "fact set" else '"content": "10.0.0.1"' in out
    assert (
        cli(*write, input="two\nlines\n\n").exit_code == 0
    )  # only the one newline that ends it goes
    shown = cli(*read, *(["-f", "json"] if name == "fact set" else [])).stdout
    assert "two\\nlines\\n" in shown


@pytest.mark.parametrize(
    "argv,data", EMPTY, ids=lambda v: " ".join(v) if isinstance(v, list) else repr(v)
)
def test_an_empty_stdin_is_refused_everywhere_and_writes_nothing(cli, conn, argv, data):
    """Nothing at all on stdin (a text: or its one newline) is refused, exit 2: a pipeline whose writer failed."""
    cli("fact", "set", "k", "kept")
    out = cli(*argv, input=data)
    assert out.exit_code == 2 and "stdin is empty" in out.stderr, (argv, out.exit_code, out.stderr)
    assert cli("fact", "get", "k").stdout == "kept\n" and count(conn) == 0


# --- one rule for times ---------------------------------------------------------------------------------------

FUTURE = "2099-01-01"
TIME_OPTIONS = [
    ["recall", "x", "--as-of", FUTURE],
    ["fact", "get", "k", "--as-of", FUTURE],
    ["fact", "list", "--as-of", FUTURE],
    ["episode", "search", "x", "--since", FUTURE],
    ["episode", "search", "x", "--until", FUTURE],
    ["episode", "list", "--since", FUTURE],
    ["fact", "set", "k", "v", "--valid-from", FUTURE],
    ["episode", "add", "x", "--created-at", FUTURE],
    ["purge", "--source", "s", "--since", FUTURE],
]


@pytest.mark.parametrize("argv", TIME_OPTIONS, ids=" ".join)
def test_every_time_option_refuses_the_future_past_the_clock_skew(cli, argv):
    cli("fact", "set", "k", "v")
    out = cli(*argv)
    assert out.exit_code == 2, (argv, out.stderr)
    assert "future" in out.stderr


def test_batch_lines_refuse_the_future_too(cli):
    out = cli(
        "episode",
        "search",
        "--batch",
        "-",
        input=json.dumps({"query": "x", "since": FUTURE}) + "\n",
    )
    assert out.exit_code == 2 and "future" in out.jsonl()[0]["error"]


# --- one rule for batches and exit codes -----------------------------------------------------------------------

BATCHES = {
    "episode search": ["episode", "search", "--batch", "-"],
    "recall": ["recall", "--batch", "-", "-f", "jsonl"],
}
FIELD = {"episode search": "query", "recall": "observation"}


@pytest.mark.parametrize("name", BATCHES)
def test_every_batch_mode_answers_each_line_with_errors_in_place_and_exits_non_zero_on_any(
    cli, name
):
    good = json.dumps({FIELD[name]: "disk alert"})
    lines = [good, "{not json", json.dumps({FIELD[name]: "disk", "k": 0}), good]
    out = cli(*BATCHES[name], input="\n".join(lines) + "\n")
    assert out.exit_code == 2, out.stderr  # the first failed line's code
    answers = out.jsonl()
    assert len(answers) == 4 and [a.get("line") for a in answers] == [None, 2, 3, None]
    assert answers[1]["exit_code"] == 2 and answers[1]["error"].startswith("line 2: ")
    assert "2 of 4 line(s) failed" in out.stderr
    assert cli(*BATCHES[name], input=good + "\n").exit_code == 0


def test_import_skip_invalid_with_every_line_invalid_exits_2(cli, conn):
    out = cli("episode", "import", "-", "--skip-invalid", input="{bad\nnot json\n")
    assert out.exit_code == 2 and "every line was invalid" in out.stderr
    ok = cli("episode", "import", "-", "--skip-invalid", input='{bad\n{"content": "fine"}\n')
    assert ok.exit_code == 0 and count(conn) == 1


def test_nothing_matched_and_nothing_to_do_exit_0_and_say_so(cli):
    cli("episode", "add", "x", "--source", "backups")
    for args in (["purge", "--source", "bakups"], ["purge", "--source", "bakups", "--yes"]):
        out = cli(*args)
        assert (
            out.exit_code == 0 and "nothing matched" in out.stderr and "'backups'" in out.stderr
        ), out.stderr
    dry = cli("summarize", "--dry-run")
    assert dry.exit_code == 0 and "nothing to summarize" in dry.stderr


def test_a_database_url_that_is_no_url_is_bad_input(cli):
    out = cli("--database-url", "not a url", "status")
    assert out.exit_code == 2 and "--database-url: not a PostgreSQL connection string" in out.stderr
