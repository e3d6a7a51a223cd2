"""Every bench script still runs: each at a tiny size, as a subprocess, to its last line.

The figures the docs and closing notes cite come from tests/bench/; a script that no longer runs
leaves a figure nobody can rerun (reembed.py called a function 573164c had removed, and nothing
said so until the script was run by hand). Nothing here is timed and no ratio is checked: at these sizes the ratios mean
nothing. What is checked is that each script exits 0 and prints the line that carries its figure.
The suite never imports tests.bench (the scripts are run, not loaded), so a bench's helpers stay
out of the tests' import graph. Marked `local`: several benches use the local embedder, and CI
runs these in the Quickstart's environment (.venv), where they are run by hand too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local

BENCH = Path(__file__).resolve().parent / "bench"

# (script and tiny-size arguments, text the output must hold: the line with the bench's figure)
RUNS = [
    ("startup.py --runs 3", "ratio (goal <= 1.5)"),
    ("import_.py --rows 2000 --rounds 1", "median of the rounds"),
    ("ingest.py --rows 1000 --rounds 1 --lines 2", "ratio ingest / episode import"),
    ("embed.py --chunks 64", "ratio (goal >= 0.9)"),
    ("reembed.py --chunks 64 --slices 2 --embedder hash", "ratio, whole run"),
    ("search.py --episodes 2000 --queries 20 --runs 1", "filtered recall@10"),
    ("dated.py --days 20", "recall@10"),
    ("period.py --episodes 2000 --days 1 --exact 1000", "a query"),
    ("prune.py --episodes 2000 --rounds 1", "longest prune transaction"),
    (
        "mcp.py --episodes 300 --calls 10 --runs 3 --embedder hash",
        "ratio tool call / fresh process",
    ),
    ("recall.py --episodes 2000", "ratio (goal <= 1.3)"),
    ("metrics.py --episodes 2000", "ratio metrics / status"),
    ("match_rows.py --episodes 2000", "unbounded"),
    ("summarize.py --episodes 1000", "peak RSS ratio"),
    ("transfer.py --rows 2000", "import ratio"),
    ("repeats.py --days 1 --rounds 1", "saved by folding"),
    ("ops_kinds.py", "retrieval_log.json"),
    ("redact.py --size 2000 --runs 1", "clean records altered"),
    ("recall_budget.py --data none --observations 0", "[ops retrieval_log.json] recall defaults"),
    ("collapse.py --data none --hits 50", "(same groups)"),
    ("local_start.py --episodes 20 --runs 3 --rounds 0", "ratio (goal <= 2)"),
    ("agents.py --episodes 2000 --calls 10 --clients 4 --seconds 2", "answers out of scope"),
    ("erasure_verify.py --episodes 2000 --runs 1", "ratio verify / plain read"),
    ("upgrade.py --episodes 2000", "longest write wait"),
    ("rss.py --calls 50 --lines 2000 --batches 4", "largest growth settled to end"),
]


@pytest.mark.parametrize("command,marker", RUNS, ids=[c.split()[0] for c, _ in RUNS])
def test_the_bench_runs(command, marker):
    script, *args = command.split()
    # The bench starts its own embedded server and reads no test setting: none of the suite's MEMCTL_*.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCTL_")}
    env["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's memctl
    )
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=BENCH.parent.parent,
    )
    assert done.returncode == 0, (
        f"{command} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    assert marker in done.stdout, f"{command} did not print {marker!r}:\n{done.stdout[-2000:]}"
