"""memctl recall: prompt-ready memory for an observation, within a token budget."""

from __future__ import annotations

import sys
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memctl.cli.common import (
    batch_error,
    batch_write,
    clock_skew,
    connect_read,
    read_text_arg,
    settings,
    since_value,
    warn,
)
from memctl.errors import BadValue, UsageError

if TYPE_CHECKING:
    from memctl.db.memory import Memory


MAX_K = 100  # memctl.recall.recall.check's bound, checked here too so the error names -k


class RecallFormat(str, Enum):
    text = "text"
    json = "json"
    jsonl = "jsonl"


def register(root: typer.Typer) -> None:
    root.command("recall")(recall)


def recall(
    observation: Annotated[
        Optional[str],
        typer.Argument(
            metavar="OBSERVATION",
            help="What the agent sees or is about to decide; '-' reads stdin (UTF-8).",
            show_default=False,
        ),
    ] = None,
    agent: Annotated[
        Optional[str], typer.Option("--agent", "-a", help="Only this agent's episodes.")
    ] = None,
    namespace: Annotated[
        Optional[str],
        typer.Option(
            "--namespace",
            "-n",
            help="Namespace of the facts (default: with --agent, the namespaces its MCP server reads: "
            "a registered agent's own and shared ones; else 'default').",
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--max-tokens",
            min=1,
            help="Budget for the whole block, header included (default: recall.max_tokens, 1000).",
            show_default=False,
        ),
    ] = None,
    k: Annotated[
        int,
        typer.Option(
            "-k",
            "--k",
            min=1,
            max=MAX_K,
            help="At most this many facts, episodes and runbooks each.",
        ),
    ] = 5,
    min_score: Annotated[
        Optional[float],
        typer.Option(
            "--min-score",
            help="Drop items scoring below this (facts and runbooks 0..1, episodes the search score).",
            show_default=False,
        ),
    ] = None,
    repo: Annotated[
        Optional[str],
        typer.Option(
            "--repo",
            help="Runbook directory (else MEMCTL_RUNBOOKS, else `runbooks` in the config; none: no runbooks).",
            show_default=False,
        ),
    ] = None,
    no_track: Annotated[
        bool,
        typer.Option(
            "--no-track", help="Read only: do not count the episodes returned as accessed."
        ),
    ] = False,
    as_of: Annotated[
        Optional[str],
        typer.Option(
            "--as-of",
            callback=since_value,
            help="The memory the agent would have had at this time (ISO 8601, or a "
            "duration back: 2d): facts valid then, episodes created before it; counts no access.",
            show_default=False,
        ),
    ] = None,
    batch: Annotated[
        Optional[str],
        typer.Option(
            "--batch",
            help="JSONL file or '-' of observations (observation, optional agent, namespace, max_tokens, k, "
            "as_of; the options are the defaults): with -f jsonl, one JSON object per line, in order, "
            "the one -f json prints; a bad line gets {line, field, error} and the batch goes on.",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        RecallFormat,
        typer.Option(
            "--format",
            "-f",
            help="text: a block to append to a prompt; json: the items with kind, score and tokens, "
            "and the total; jsonl: one item per line.",
        ),
    ] = RecallFormat.text,
) -> None:
    """Facts, then episodes, then runbooks relevant to OBSERVATION, as whole items within --max-tokens.

    Facts are current truth; episodes are past events with their age and source (hybrid search).

    Runbooks are listed by name and title. Near-duplicate episodes collapse onto the best one.

    With the embedder down, episodes are found by words only (warning on stderr).

    With nothing relevant, prints nothing and exits 0; when what was found does not fit --max-tokens, exits 2 saying so. Episodes returned count as accessed unless --no-track.
    """
    from memctl.cli.render import inert, to_json
    from memctl.recall import recall as recall_mod
    from memctl.records.facts import moment

    if (batch is None) == (observation is None):
        raise UsageError(
            "give an OBSERVATION or --batch FILE, not both"
            if batch
            else "give an OBSERVATION or --batch FILE"
        )
    conn = connect_read(vector=True)
    # no --namespace (None): the namespaces the agent's MCP server reads, found by the library
    base = recall_mod.Request(
        observation or "",
        agent=agent,
        namespace=namespace,
        k=k,
        max_tokens=max_tokens,
        min_score=min_score,
        repo=repo,
        track=not no_track,
        as_of=moment(as_of, "--as-of", clock_skew()),
    )
    if batch is not None:
        if fmt is not RecallFormat.jsonl:
            raise UsageError("--batch writes one JSON object per observation: add -f jsonl")
        _recall_batch(conn, batch, base)
        return
    assert observation is not None  # one of the two, checked above
    request = replace(base, observation=read_text_arg(observation, "episode_bytes", "observation"))
    result = recall_mod.recall(conn, request)
    for message in result.warnings:
        warn(message)
    if (
        not result.items and result.left_out
    ):  # found, but the budget holds none: not the silence of "nothing"
        raise BadValue(
            f"--max-tokens {result.max_tokens}: {result.left_out} relevant item(s) found and none fits "
            "in that budget (the header included): raise --max-tokens",
            "--max-tokens",
        )
    if fmt is RecallFormat.text:
        sys.stdout.write(
            inert(result.text())
        )  # a prompt block read by people too: stored text's controls escaped
    elif fmt is RecallFormat.json:
        sys.stdout.write(to_json(result.to_dict(), indent=2) + "\n")
    else:
        for item in result.items:
            sys.stdout.write(to_json(item.to_dict()) + "\n")


def _recall_batch(conn: Memory, path: str, base) -> None:
    """One recall per JSONL line, all in one recall_batch; a bad line's place holds its error object. A line
    naming an agent but no namespace reads that agent's namespaces, as `recall --agent` does."""
    from memctl.files import jsonl
    from memctl.errors import BadValue
    from memctl.recall import recall as recall_mod

    slots: list = []  # a Request, or the error object of a bad line (common.batch_error)

    def refused(error) -> None:
        slots.append(batch_error(error.number, error))

    from memctl.write import values

    lines = jsonl.bounded(
        jsonl.open_input(path),
        values.Limits.of(settings()).line_bytes(),
        "an observation within [limits]",
        "nothing was run",
    )
    for number, item in jsonl.read(lines, on_error=refused):
        try:
            slots.append(recall_mod.batch_request(item, number, base))
        except BadValue as exc:
            slots.append(batch_error(number, exc))
    requests = [s for s in slots if isinstance(s, recall_mod.Request)]
    batch_write(
        slots,
        recall_mod.recall_batch(conn, requests) if requests else [],
        lambda request, result: (result.to_dict(), result.warnings),
    )
