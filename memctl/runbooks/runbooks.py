"""Runbooks (procedural memory): Markdown files in a git repository, run exactly.

A runbook is NAME.md in the runbook directory: a title (`# ...`), a
description, and numbered steps (`## 1. Title`, `## Step 1: Title`, or a list
item `1. Title`), each with exactly one fenced ```sh block: the step's command.
Runbooks are never embedded. A run executes the steps in order at a known
commit, refuses uncommitted changes unless allowed, and is recorded in
runbook_runs and as an episode of kind 'runbook'.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from memctl.errors import ConfigError, InvalidInput, MemctlError, NotFound, Unavailable, UsageError
from memctl.runbooks.runbook_format import NOT_RUNBOOKS, Runbook, Step, check_name, parse  # noqa: F401 - the public API
from memctl.write.values import WRITER

if TYPE_CHECKING:
    from memctl.db.memory import Memory

TAIL_BYTES = 64 * 1024
MARKER_ROOM = 64  # "[N earlier bytes of output not kept]\n" fits
SHELL = "/bin/sh"


# ---------------------------------------------------------------------------
# The repository


def _git():
    try:
        import git
    except ImportError as exc:  # GitPython raises ImportError when it finds no git executable
        raise Unavailable(f"runbooks need git: {exc}") from None
    return git


def open_repository(option: str | None, settings) -> "Repository":
    """The runbook directory from --repo, else MEMCTL_RUNBOOKS, else `runbooks` in the config file."""
    value = option or settings.runbooks
    if not value:
        raise ConfigError(
            "no runbook repository configured: pass --repo DIR, set MEMCTL_RUNBOOKS=DIR, "
            'or put runbooks = "DIR" at the top of the config file (memctl config path)'
        )
    return Repository(Path(value).expanduser())


class Repository:
    """A directory of NAME.md runbooks inside a git work tree (it may be a subdirectory)."""

    def __init__(self, directory: Path):
        git = _git()
        if not directory.is_dir():
            raise ConfigError(
                f"runbook repository {directory} does not exist or is not a directory"
            )
        try:
            self.repo = git.Repo(directory, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise ConfigError(
                f"runbook repository {directory} is not in a git repository "
                "(git init, then commit the runbooks)"
            ) from None
        if self.repo.bare or not self.repo.working_tree_dir:
            raise ConfigError(
                f"runbook repository {directory} is a bare git repository; give a checkout"
            )
        self.root = directory.resolve()
        self.top = Path(self.repo.working_tree_dir).resolve()

    def names(self) -> list[str]:
        found = (p.name[:-3] for p in self.root.glob("*.md") if p.is_file())
        return sorted(n for n in found if n.lower() not in NOT_RUNBOOKS)

    def locate(self, name: str, *, must_exist: bool = True) -> tuple[str, Path]:
        """(name, resolved path) of a runbook; refuses anything that leads outside the directory."""
        name = check_name(name)
        path = self.root / f"{name}.md"
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root):
            raise UsageError(
                f"runbook {name!r} is a symlink to {resolved}, outside the runbook repository"
            )
        if must_exist and not resolved.is_file():
            raise NotFound(f"no runbook {name!r} in {self.root}")
        return name, resolved

    def git_path(self, path: Path) -> str:
        return path.relative_to(self.top).as_posix()

    def head(self) -> str | None:
        try:
            return self.repo.head.commit.hexsha
        except ValueError:  # no commit yet
            return None

    def is_dirty(self, name: str) -> bool:
        """Whether the runbook's file (and a symlink's target) differs from HEAD, is untracked or ignored."""
        link = self.root / f"{name}.md"
        paths = {self.git_path(link), self.git_path(link.resolve())}
        status = self.repo.git.status(
            "--porcelain", "--ignored", "--untracked-files=all", "--", *sorted(paths)
        )
        return bool(status.strip())

    def load(self, name: str, at: str | None = None) -> Runbook:
        """The runbook as it is in the work tree, or as it was at commit AT."""
        if at is not None:
            return self._load_at(name, at)
        runbook = self.read(name)
        runbook.commit, runbook.dirty = self.head(), self.is_dirty(runbook.name)
        return runbook

    def read(self, name: str) -> Runbook:
        """The runbook as it is in the work tree, parsed; no git status (see load)."""
        name, path = self.locate(name)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"runbook {name!r}: not valid UTF-8 (byte {exc.start})") from None
        runbook = parse(text, name)
        runbook.path = self.git_path(path)
        return runbook

    def _load_at(self, name: str, at: str) -> Runbook:
        name, path = self.locate(name, must_exist=False)
        commit = self.commit(at)
        rel = self.git_path(self.root / f"{name}.md")
        try:
            blob = commit.tree / rel
        except KeyError:
            raise NotFound(
                f"runbook {name!r} does not exist at commit {commit.hexsha[:12]}"
            ) from None
        if blob.type != "blob" or blob.mode & 0o170000 == 0o120000:
            raise InvalidInput(
                f"runbook {name!r} at commit {commit.hexsha[:12]} is not a regular file"
            )
        try:
            text = blob.data_stream.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"runbook {name!r} at {commit.hexsha[:12]}: not valid UTF-8 (byte {exc.start})"
            ) from None
        runbook = parse(text, name)
        runbook.commit, runbook.path = commit.hexsha, rel
        return runbook

    def commit(self, rev: str):
        git = _git()
        if not rev.strip() or rev.startswith("-"):
            raise UsageError(f"not a commit: {rev!r}")
        try:
            found = self.repo.commit(rev)
            found.tree  # a full sha resolves lazily: reading it proves the commit exists
            return found
        except (ValueError, IndexError, git.BadName, git.BadObject, git.GitCommandError):
            raise NotFound(f"no commit {rev!r} in the runbook repository") from None

    def log(self, name: str) -> list[dict]:
        """Commits that touched the runbook, newest first."""
        name, _ = self.locate(name, must_exist=False)
        rel = self.git_path(self.root / f"{name}.md")
        if self.head() is None:
            raise NotFound(f"runbook {name!r} has no commits (the repository has none yet)")
        rows = [
            {
                "commit": c.hexsha,
                "date": c.committed_datetime,
                "author": f"{c.author.name} <{c.author.email}>",
                "message": c.summary,
            }
            for c in self.repo.iter_commits(paths=rel)
        ]
        if not rows:
            raise NotFound(f"runbook {name!r} has no commits")
        return rows

    def entries(self) -> list[dict]:
        """Every runbook: name, title, commit, and the problem when it does not parse."""
        head, rows = self.head(), []
        for name in self.names():
            row = {"name": name, "title": None, "description": "", "commit": head, "problem": None}
            try:
                runbook = self.read(name)
                row.update(title=runbook.title, description=runbook.description)
            except MemctlError as exc:
                row["problem"] = str(exc)
            rows.append(row)
        return rows

    def find(self, words: str) -> list[dict]:
        """Runbooks whose title, name or description has any of WORDS; title hits count double."""
        terms = sorted(set(re.findall(r"\w+", words.lower())))
        if not terms:
            raise UsageError("give at least one word to find")
        found = []
        for entry in self.entries():
            if entry["problem"]:
                continue
            title = f"{entry['name']} {entry['title']}".lower()
            description = entry["description"].lower()
            score = sum(2 * (t in title) + (t in description) for t in terms)
            if score:
                found.append({"name": entry["name"], "title": entry["title"], "score": score})
        return sorted(found, key=lambda r: (-r["score"], r["name"]))


# ---------------------------------------------------------------------------
# Running


def prepare(
    repository: Repository, name: str, *, from_step: int = 1, allow_dirty: bool = False
) -> Runbook:
    """Load a runbook for a run: committed (unless allowed), and FROM_STEP within its steps."""
    runbook = repository.load(name)
    if runbook.commit is None:
        raise InvalidInput(
            f"the runbook repository has no commit yet: commit {runbook.path} before running it"
        )
    if runbook.dirty and not allow_dirty:
        raise InvalidInput(
            f"runbook {runbook.name!r} has uncommitted or untracked changes ({runbook.path}): "
            "commit them, or pass --allow-dirty (the run is then recorded as dirty)"
        )
    if not 1 <= from_step <= len(runbook.steps):
        raise UsageError(
            f"--from-step {from_step}: runbook {runbook.name!r} has steps 1 to {len(runbook.steps)}"
        )
    return runbook


class _Tail:
    """The last TAIL_BYTES of a run's output: the part kept in the record, through the gate (Gate.run_output:
    secrets redacted, or the output refused, as [redaction] mode says for every text).

    A little more than that is held, so a URL cut at the front of the tail is still
    whole when it is redacted; the cut to TAIL_BYTES comes after redaction.
    """

    def __init__(self, limit: int = TAIL_BYTES, slack: int = 4096):
        self.limit, self.keep, self.data, self.dropped = limit, limit + slack, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        excess = len(self.data) - self.keep
        if excess > 0:
            del self.data[:excess]
            self.dropped += excess

    def text(self, clean: Callable[[str], str]) -> str:
        text = (
            bytes(self.data).replace(b"\x00", b"").decode("utf-8", "replace")
        )  # text columns reject NUL
        data = clean(text).encode("utf-8")
        if not self.dropped and len(data) <= self.limit:
            return data.decode("utf-8")
        budget = self.limit - MARKER_ROOM
        # no half character at the cut
        kept = (
            data[len(data) - budget :].lstrip(bytes(range(0x80, 0xC0)))
            if len(data) > budget
            else data
        )
        dropped = self.dropped + len(data) - len(kept)
        return f"[{dropped} earlier bytes of output not kept]\n" + kept.decode("utf-8")


FINISH_RUN = (
    WRITER
    + """
UPDATE runbook_runs
   SET finished_at = now(), outcome = %(outcome)s, failed_step = %(failed_step)s, exit_code = %(exit_code)s,
       duration_s = %(duration_s)s, output_tail = %(output_tail)s
 WHERE agent = %(agent)s AND id = %(id)s
RETURNING *
"""
)
SET_EPISODE = WRITER + "UPDATE runbook_runs SET episode_id = %s WHERE agent = %s AND id = %s"


def run(
    conn: Memory,
    repository: Repository,
    runbook: Runbook,
    *,
    from_step: int = 1,
    agent: str = "default",
    on_output: Callable[[bytes], None] | None = None,
) -> dict:
    """Run the steps from FROM_STEP in order, each through `sh -e -c`, stopping at the first failure.

    Steps run in the runbook directory with the caller's environment plus
    MEMCTL_RUNBOOK, MEMCTL_RUNBOOK_COMMIT and MEMCTL_RUNBOOK_STEP, stdin closed;
    their output (stdout and stderr together) goes to on_output as it comes.
    Returns the recorded run, with episode_id or episode_error.
    """
    settings = conn.settings
    from memctl.write import gate, store

    admit = gate.Gate(conn, settings)
    admitted = admit.run_record(
        {
            "agent": agent,
            "name": runbook.name,
            "commit": runbook.commit,
            "dirty": runbook.dirty,
            "steps": len(runbook.steps),
            "from_step": from_step,
        }
    )
    record = {**admitted.row, **store.insert_run(conn, admitted).fetchone()}
    tail, clock = _Tail(), time.monotonic()

    def emit(data: bytes) -> None:
        tail.add(data)
        if on_output is not None:
            on_output(data)

    failed = None
    try:
        for step in runbook.steps[from_step - 1 :]:
            failed = step
            code = _run_step(repository.root, runbook, step, emit)
            if code != 0:
                emit(f"--- step {step.number} failed: {exit_text(code)}\n".encode())
                break
            failed = None
    except BaseException:  # interrupted (Ctrl-C) or crashed: leave a finished, failed record behind
        failed = failed or runbook.steps[from_step - 1]
        tail.add(f"--- interrupted during step {failed.number}\n".encode())
        _add_episode(conn, runbook, _finish(conn, admit, record, failed, None, tail, clock))
        raise
    result = _finish(conn, admit, record, failed, code if failed else None, tail, clock)
    return _add_episode(conn, runbook, result)


def _run_step(cwd: Path, runbook: Runbook, step: Step, emit: Callable[[bytes], None]) -> int:
    emit(f"--- step {step.number}/{len(runbook.steps)}: {step.title}\n".encode())
    env = {
        **os.environ,
        "MEMCTL_RUNBOOK": runbook.name,
        "MEMCTL_RUNBOOK_COMMIT": runbook.commit or "",
        "MEMCTL_RUNBOOK_STEP": str(step.number),
    }
    # The command text is one argument of sh: never pasted into another shell string. The step
    # stays in memctl's process group, so Ctrl-C reaches it and a password prompt on /dev/tty works.
    proc = subprocess.Popen(
        [SHELL, "-e", "-c", step.command, f"{runbook.name}:{step.number}"],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None  # PIPE
    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            emit(chunk)
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted
            proc.terminate()
            proc.wait()
        proc.stdout.close()


def exit_text(code: int | None) -> str:
    if code is None:
        return "interrupted"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _finish(
    conn: Memory,
    admit,
    record: dict,
    failed: Step | None,
    code: int | None,
    tail: _Tail,
    clock: float,
) -> dict:
    from memctl.write import gate, store
    from memctl.redact import SecretRefused

    try:
        output = tail.text(admit.run_output)
    except (
        SecretRefused
    ) as refused:  # block mode: the run happened and is recorded, its output is not kept
        output = f"[output not kept: {refused}]"
    values = {
        **record,
        "outcome": "failed" if failed else "ok",
        "failed_step": failed.number if failed else None,
        "exit_code": code,
        "duration_s": round(time.monotonic() - clock, 3),
        "output_tail": output,
    }
    row = conn.execute(FINISH_RUN, values).fetchone()
    if row is None:  # the row vanished during the run (a restore): written again, through the gate
        row = store.insert_run(
            conn, gate.Gate(conn, None, redact_off()).run_record(values), "reinsert"
        ).fetchone()
    return dict(row)


def redact_off():
    """The run's fields were admitted through the gate already (run_record, run_output)."""
    from memctl.redact import Redactor

    return Redactor("off")


def _add_episode(conn: Memory, runbook: Runbook, run: dict) -> dict:
    from memctl.records import episodes

    meta = {
        key: run[key]
        for key in (
            "commit",
            "dirty",
            "outcome",
            "from_step",
            "failed_step",
            "exit_code",
            "duration_s",
        )
    }
    meta.update(
        runbook=runbook.name, title=runbook.title, run_id=run["id"], steps=len(runbook.steps)
    )
    run["episode_id"], run["episode_error"] = None, None
    try:
        run["episode_id"] = episodes.add(
            conn,
            episode_text(runbook, run),
            kind="runbook",
            source=f"runbook:{runbook.name}",
            agent=run["agent"],
            importance=None,
            meta=meta,
        )
    except MemctlError as exc:  # the run is on the record already; the episode is its summary
        run["episode_error"] = str(exc)
    if run["episode_id"] is not None:
        conn.execute(SET_EPISODE, (run["episode_id"], run["agent"], run["id"]))
    return run


def episode_text(runbook: Runbook, run: dict) -> str:
    """What the episode says: the runbook, the commit it ran, and how it ended."""
    total = len(runbook.steps)
    dirty = " with uncommitted changes (--allow-dirty)" if run["dirty"] else ""
    head = f"Ran runbook {runbook.name} ({runbook.title}) at commit {run['commit']}{dirty}"
    if run["outcome"] == "ok":
        return (
            f"{head}: ok, steps {run['from_step']}-{total} of {total} in {run['duration_s']:.1f} s."
        )
    lines = run["output_tail"].rstrip("\n").splitlines()[-10:]
    return f"{head}: {failure(runbook, run)}.\nLast output:\n" + "\n".join(
        line[:200] for line in lines
    )


def failure(runbook: Runbook, run: dict) -> str:
    """E.g. 'step 2 (Title) failed, exit code 3; steps 3-4 not run'."""
    step, total = runbook.steps[run["failed_step"] - 1], len(runbook.steps)
    rest = {0: "", 1: f"; step {total} not run"}.get(
        total - step.number, f"; steps {step.number + 1}-{total} not run"
    )
    return f"step {step.number} ({step.title}) failed, {exit_text(run['exit_code'])}{rest}"


RUNS = """
SELECT id, agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step, failed_step, exit_code,
       duration_s, episode_id, output_tail
FROM runbook_runs
WHERE name = %(name)s AND (%(agent)s::text IS NULL OR agent = %(agent)s)
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s
"""
LAST_RUNS = """
SELECT DISTINCT ON (name) name, started_at, outcome FROM runbook_runs ORDER BY name, started_at DESC, id DESC
"""


def runs(conn: Memory, name: str, *, agent: str | None = None, limit: int = 20) -> list[dict]:
    """Recorded runs of a runbook, newest first."""
    return conn.execute(RUNS, {"name": check_name(name), "agent": agent, "limit": limit}).fetchall()


def last_runs(conn: Memory) -> dict[str, dict]:
    """name -> {started_at, outcome} of its latest run."""
    return {row["name"]: row for row in conn.execute(LAST_RUNS)}


def as_text(runbook: Runbook, *, fenced: bool) -> str:
    """The runbook as Markdown to read: title, commit, description, each step with its command
    (fenced as ```sh for a model to read, indented for a terminal)."""
    state = " (uncommitted changes)" if runbook.dirty else ""
    parts = [f"# {runbook.title}", f"{runbook.name} at {runbook.commit or 'no commit'}{state}", ""]
    if runbook.description:
        parts += [runbook.description, ""]
    for step in runbook.steps:
        parts.append(f"## {step.number}. {step.title}")
        if step.text:
            parts.append(step.text)
        command = step.command.rstrip("\n")
        parts += (
            ["```sh", command, "```", ""]
            if fenced
            else ["    " + line for line in command.splitlines()] + [""]
        )
    return "\n".join(parts)
