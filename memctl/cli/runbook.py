"""memctl runbook: procedures kept in git, run exactly, every run on the record."""

from __future__ import annotations

import codecs
import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, settings, warn
from memctl.cli.render import Format, inert, render, render_one
from memctl.errors import MemctlError
from memctl.runbooks import runbooks

app = typer.Typer(
    help="Runbooks: NAME.md files in a git repository (--repo, MEMCTL_RUNBOOKS or `runbooks` in the config), "
    "each a title, a description and numbered steps with one ```sh block each. Never embedded; "
    "run step by step at a known commit, every run recorded.",
    no_args_is_help=True,
)

RepoOption = Annotated[
    Optional[str],
    typer.Option(
        "--repo",
        help="Runbook directory in a git work tree (else MEMCTL_RUNBOOKS, else `runbooks` "
        "in the config file).",
        show_default=False,
    ),
]
NameArg = Annotated[
    str, typer.Argument(help="Runbook name: NAME or NAME.md, a file in the runbook directory.")
]
RUN_COLUMNS = [
    "id",
    "name",
    "commit",
    "dirty",
    "started_at",
    "outcome",
    "from_step",
    "failed_step",
    "exit_code",
    "duration_s",
    "episode_id",
]


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="runbook")


def _repository(repo: str | None) -> runbooks.Repository:
    return runbooks.open_repository(repo, settings())


@app.command("list")
def list_(repo: RepoOption = None, fmt: FormatOption = Format.table) -> None:
    """Every runbook with its title, the commit it is at, and its last run."""
    entries = _repository(repo).entries()
    for entry in entries:
        if entry["problem"]:
            warn(entry["problem"])
    last = _last_runs()
    rows = (
        {
            "name": e["name"],
            "title": e["title"],
            "commit": e["commit"],
            "last_run": last.get(e["name"], {}).get("started_at"),
            "last_outcome": last.get(e["name"], {}).get("outcome"),
        }
        for e in entries
    )
    render(rows, fmt)


def _last_runs() -> dict:
    import psycopg

    from memctl.config import mask_secrets

    try:
        return runbooks.last_runs(connect())
    except (MemctlError, psycopg.Error) as exc:
        warn(
            mask_secrets(
                f"run history unavailable, last_run and last_outcome left empty: {str(exc).strip()}"
            )
        )
        return {}


@app.command()
def show(
    name: NameArg,
    at: Annotated[
        Optional[str], typer.Option("--at", help="Show it as it was at this commit.")
    ] = None,
    repo: RepoOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """A runbook's title, description and steps (json: the parsed document; jsonl/csv: one row per step)."""
    runbook = _repository(repo).load(name, at=at)
    if fmt is Format.table:
        sys.stdout.write(inert(_as_text(runbook)))
    elif fmt is Format.json:
        render_one(runbook.to_dict(), fmt)
    else:
        render((vars(step) for step in runbook.steps), fmt)


def _as_text(runbook: runbooks.Runbook) -> str:
    return runbooks.as_text(runbook, fenced=False)


@app.command()
def log(name: NameArg, repo: RepoOption = None, fmt: FormatOption = Format.table) -> None:
    """The runbook's git history, newest first: commit, date, author, message."""
    render(_repository(repo).log(name), fmt)


@app.command()
def find(
    words: Annotated[
        list[str], typer.Argument(help="Words to look for (any matches; case-insensitive).")
    ],
    repo: RepoOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Runbooks whose title or description has any of WORDS, most matches first (title matches count double)."""
    rows = _repository(repo).find(" ".join(words))
    if not rows:
        warn("no runbook matches")
    render(rows, fmt)


@app.command()
def run(
    name: NameArg,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the steps that would run; run and record nothing."),
    ] = False,
    from_step: Annotated[
        int, typer.Option("--from-step", min=1, help="Start at step N (recorded).")
    ] = 1,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Run without asking for confirmation.")
    ] = False,
    allow_dirty: Annotated[
        bool,
        typer.Option(
            "--allow-dirty",
            help="Run a runbook with uncommitted or untracked changes (recorded as dirty).",
        ),
    ] = False,
    agent: Annotated[
        str, typer.Option("--agent", help="Agent the run and its episode belong to.")
    ] = "default",
    repo: RepoOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Run the steps in order, each through `sh -e` in the runbook directory, stopping at the first failure.

    Steps get your environment plus MEMCTL_RUNBOOK, MEMCTL_RUNBOOK_COMMIT and
    MEMCTL_RUNBOOK_STEP, and no stdin. Their output streams to stderr; the run's
    record is printed to stdout at the end. Exit 0 when every step succeeded,
    1 when one failed. A runbook with uncommitted changes is refused unless
    --allow-dirty; without --yes, confirmation is asked on the terminal.
    """
    repository = _repository(repo)
    runbook = runbooks.prepare(repository, name, from_step=from_step, allow_dirty=allow_dirty)
    steps = runbook.steps[from_step - 1 :]
    if dry_run:
        render(({"step": s.number, "title": s.title, "command": s.command} for s in steps), fmt)
        warn(
            f"dry run: {len(steps)} step(s) of {runbook.name} at {runbook.commit}; nothing run, nothing recorded"
        )
        return
    if runbook.dirty:
        warn(
            f"{runbook.path} has uncommitted changes; running it anyway (--allow-dirty), recorded as dirty"
        )
    if not yes:
        _confirm(runbook, steps)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def stream(data: bytes) -> None:
        sys.stderr.write(decoder.decode(data))
        sys.stderr.flush()

    result = runbooks.run(
        connect(), repository, runbook, from_step=from_step, agent=agent, on_output=stream
    )
    render_one(result if fmt is not Format.table else {k: result[k] for k in RUN_COLUMNS}, fmt)
    if result["episode_error"]:
        warn(f"run recorded, but its episode was not: {result['episode_error']}")
    if result["outcome"] != "ok":
        warn(runbooks.failure(runbook, result))
        raise typer.Exit(1)


def _confirm(runbook: runbooks.Runbook, steps: list[runbooks.Step]) -> None:
    if not sys.stdin.isatty():
        raise MemctlError(
            f"not running {runbook.name}: stdin is not a terminal to confirm on; "
            "pass --yes to run it (or --dry-run to see the steps)"
        )
    for step in steps:
        warn(f"step {step.number}: {step.title}")
    at = runbook.commit[:12] if runbook.commit else "no commit yet"  # a repository without one
    if not typer.confirm(f"Run {len(steps)} step(s) of {runbook.name} at {at}?", err=True):
        warn("nothing run")
        raise typer.Exit(1)


@app.command()
def runs(
    name: NameArg,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="At most this many runs.")
    ] = 20,
    agent: Annotated[Optional[str], typer.Option("--agent", help="Only this agent's runs.")] = None,
    repo: Annotated[
        Optional[str], typer.Option("--repo", hidden=True)
    ] = None,  # runs come from the database
    fmt: FormatOption = Format.table,
) -> None:
    """Recorded runs of NAME, newest first (table leaves out the output tail; json etc. include it)."""
    rows = runbooks.runs(connect(), name, agent=agent, limit=limit)
    if not rows:
        warn(f"no recorded runs of {runbooks.check_name(name)}")
    render(rows, fmt, columns=RUN_COLUMNS if fmt is Format.table else None)
