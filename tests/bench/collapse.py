"""Recall's near-duplicate collapse: milliseconds a recall, memctl.recall.recall_episodes.collapse against the
plain walk (every hit against every kept one, the definition), on the same hits in one run.

A recall collapses its search's k × 3 hits (300 for `-k 100`). The hits here are, for each LoCoMo question
(../shared/eval/locomo-dev.json, retrieval.py's loading), the --hits turns of its conversation that share the
most words with it (a text search's candidates: ordinary sentences sharing "the", "i", "a"); with --data none,
the operations sets' entries of tests/data and near copies of them (a word shorter, a word longer, shouted,
shuffled), in --hits slices. Also printed: a crafted worst case, hits that all share ten words and differ in
one (no two close, every pair sharing a prefix word). Both functions are checked to give the same groups.

    python tests/bench/collapse.py [--data ../shared/eval/locomo-dev.json] [--hits 300] [--questions 200]
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import retrieval  # noqa: E402
from test_recall_collapse import hits_of, near_copies, ops_texts, plain_collapse  # noqa: E402

from memctl.recall import recall_episodes  # noqa: E402

WORD = re.compile(r"\w+")


def locomo_hit_lists(path: Path, size: int, questions: int) -> list[list]:
    rows, _, asked = retrieval.load_locomo(path, None)
    by_agent: dict[str, list[str]] = {}
    for r in rows:
        by_agent.setdefault(r["agent"], []).append(r["content"])
    lists = []
    for agent, question, _, _ in random.Random(1).sample(asked, min(questions, len(asked))):
        words = set(WORD.findall(question.lower()))
        turns = by_agent[agent]
        shared = sorted(
            range(len(turns)), key=lambda i: -len(words & set(WORD.findall(turns[i].lower())))
        )[:size]
        lists.append(
            hits_of([turns[i] for i in shared], [1.0 - rank / 1000 for rank in range(len(shared))])
        )
    return lists


def per_call(function, lists: list[list], threshold: float) -> tuple[float, list]:
    started = time.perf_counter()
    out = [function(hits, threshold) for hits in lists]
    return (time.perf_counter() - started) * 1000 / len(lists), out


def compare(name: str, lists: list[list], threshold: float = 0.9) -> None:
    fast, got = per_call(recall_episodes.collapse, lists, threshold)
    plain, want = per_call(plain_collapse, lists, threshold)
    assert [[(h.id, d) for h, d in x] for x in got] == [[(h.id, d) for h, d in x] for x in want], (
        name
    )
    print(
        f"{name}: {len(lists)} recalls of {len(lists[0])} hits: collapse {fast:.1f} ms a recall, plain walk "
        f"{plain:.1f} ms; ratio {fast / plain:.3f} (same groups)",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default=str(retrieval.DEFAULT_DATA), help="LoCoMo JSON, or 'none'")
    p.add_argument("--hits", type=int, default=300)
    p.add_argument("--questions", type=int, default=200)
    args = p.parse_args()
    if args.data != "none":
        compare("LoCoMo", locomo_hit_lists(Path(args.data), args.hits, args.questions))
    texts = near_copies(ops_texts(), seed=7)
    slices = [texts[i : i + args.hits] for i in range(0, len(texts), args.hits)]
    compare(
        "operations sets and near copies", [hits_of(s) for s in slices if len(s) == len(slices[0])]
    )
    common = " ".join(f"c{j}" for j in range(10))
    compare(
        "crafted: ten shared words, one apart",
        [hits_of([f"{common} u{i}" for i in range(args.hits)])],
    )


if __name__ == "__main__":
    main()
