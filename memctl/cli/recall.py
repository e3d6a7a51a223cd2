"""memctl recall: prompt-ready memory for an observation, within a token budget."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from memctl.cli.common import connect_read, read_text_arg, settings, since_value, warn


MAX_K = 100  # memctl.reading.recall.check's bound, checked here too so the error names -k


class RecallFormat(str, Enum):
    text = "text"
    json = "json"
    jsonl = "jsonl"


def register(root: typer.Typer) -> None:
    root.command("recall")(recall)


def recall(
    observation: Annotated[str, typer.Argument(
        metavar="OBSERVATION", help="What the agent sees or is about to decide; '-' reads stdin (UTF-8).")],
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", help="Only this agent's episodes.")] = None,
    namespace: Annotated[Optional[str], typer.Option(
        "--namespace", "-n", help="Namespace of the facts (default: with --agent, the namespaces its MCP server reads: "
                                  "a registered agent's own and shared ones; else 'default').",
        show_default=False)] = None,
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", min=1, help="Budget for the whole block, header included (default: recall.max_tokens, 1000).",
        show_default=False)] = None,
    k: Annotated[int, typer.Option(
        "-k", "--k", min=1, max=MAX_K, help="At most this many facts, episodes and runbooks each.")] = 5,
    min_score: Annotated[Optional[float], typer.Option(
        "--min-score", help="Drop items scoring below this (facts and runbooks 0..1, episodes the search score).",
        show_default=False)] = None,
    repo: Annotated[Optional[str], typer.Option(
        "--repo", help="Runbook directory (else MEMCTL_RUNBOOKS, else `runbooks` in the config; none: no runbooks).",
        show_default=False)] = None,
    no_track: Annotated[bool, typer.Option(
        "--no-track", help="Read only: do not count the episodes returned as accessed.")] = False,
    as_of: Annotated[Optional[str], typer.Option(
        "--as-of", callback=since_value, help="The memory the agent would have had at this time (ISO 8601, or a "
        "duration back: 2d): facts valid then, episodes created before it; counts no access.",
        show_default=False)] = None,
    fmt: Annotated[RecallFormat, typer.Option(
        "--format", "-f", help="text: a block to append to a prompt; json: the items with kind, score and tokens, "
                               "and the total; jsonl: one item per line.")] = RecallFormat.text,
) -> None:
    """Facts, then episodes, then runbooks relevant to OBSERVATION, as whole items within --max-tokens.

    Facts are current truth; episodes are past events with their age and source (hybrid search).

    Runbooks are listed by name and title. Near-duplicate episodes collapse onto the best one.

    With the embedder down, episodes are found by words only (warning on stderr).

    With nothing relevant, prints nothing and exits 0. Episodes returned count as accessed unless --no-track.
    """
    from memctl.cli.render import to_json
    from memctl.reading import recall as recall_mod
    from memctl.records.facts import moment

    from memctl.records import agents

    conn = connect_read(vector=True)
    shared: tuple[str, ...] = ()
    if namespace is None:
        namespace, shared = agents.namespaces_for(conn, agent)
    request = recall_mod.Request(read_text_arg(observation), agent=agent, namespace=namespace, shared=shared, k=k,
                                 max_tokens=max_tokens, min_score=min_score, repo=repo, track=not no_track,
                                 as_of=moment(as_of, "--as-of"))
    result = recall_mod.recall(conn, settings(), request)
    for message in result.warnings:
        warn(message)
    if fmt is RecallFormat.text:
        sys.stdout.write(result.text())
    elif fmt is RecallFormat.json:
        sys.stdout.write(to_json(result.to_dict(), indent=2) + "\n")
    else:
        for item in result.items:
            sys.stdout.write(to_json(item.to_dict()) + "\n")
