"""What [search] context_kinds does on memory that is not conversation: the labelled operations sets.

Neighbour context (docs/search.md) lifts an episode by the best base score of the entries just
before and after it in its agent's log, when they are of the same kind, within context_window,
and of a kind in context_kinds (default "conversation"). The three labelled sets of
tests/test_search.py are operations memories, not dialogue:

- retrieval.json: 30 stand-alone memories written in one go (no times: every entry is within
  the window of its neighbours), questions paraphrased;
- retrieval_log.json: one agent's log over a week, incidents told in consecutive entries;
- retrieval_tokens.json: a log of near twins that differ in one exact token.

Each set is loaded into its own fresh database through the CLI (`memctl episode import`, kind
"observation", the kind `episode add` writes by default; times as labelled), embedded with the
local all-minilm (`memctl embed`), ANALYZEd, then asked every question as one `memctl episode
search --batch --no-track` (k 10) per [search] setting:

- context_kinds = "conversation" (the default: these episodes get no context),
- context_kinds = "" (context off),
- context_kinds = "conversation,observation,alert" (the kinds of this memory included).

The log set is loaded a second time with mixed kinds, as monitoring and an agent write them: the
entry that opens each incident (its symptom, MIXED_ALERTS) as kind "alert", the rest
"observation"; context links only entries of the same kind. Prints recall@1, @5 and @10 (the
share of a question's answer entries among its first k hits, as the tests count it).
--variant adds a run with more [search] settings, e.g. "context_window=3h".

    python tests/bench/ops_kinds.py [--variant context_window=3h]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import retrieval
from _common import fresh_database, parser, server

DATA = Path(__file__).resolve().parents[1] / "data"
SETS = ("retrieval.json", "retrieval_log.json", "retrieval_tokens.json")
# retrieval_log.json's entries (1-based) that open an incident with its symptom, as an alerting system
# would record them; in the "mixed" loading they are of kind alert, every other entry observation.
MIXED_ALERTS = {3, 9, 13, 17, 21, 23, 25, 29, 31, 34}
CONTEXT_KINDS = (
    ("default (conversation)", None),
    ("none", ""),
    ("conversation,observation,alert", "conversation,observation,alert"),
)
KS = (1, 5, 10)


def rows_of(data: dict, mixed: bool) -> list[dict]:
    rows = []
    for number, entry in enumerate(data["episodes"], 1):
        when, text = entry if isinstance(entry, list) else (None, entry)
        row = {
            "content": text,
            "kind": "alert" if mixed and number in MIXED_ALERTS else "observation",
        }
        if when:
            row["created_at"] = when
        rows.append(row)
    return rows


def write_config(path: Path, kinds: str | None, variant: str) -> None:
    """retrieval.py's settings (search_timeout 300, the variant's [search] keys), then context_kinds."""
    retrieval.write_config(path, variant)
    if kinds is not None:  # [search] is the file's last table: this line belongs to it
        with path.open("a", encoding="utf-8") as handle:
            handle.write(f"context_kinds = {json.dumps(kinds)}\n")


def memctl(env: dict, *args: str, stdin: str | None = None) -> str:
    command = [str(Path(sys.executable).with_name("memctl")), *args]
    done = subprocess.run(command, input=stdin, text=True, capture_output=True, env=env)
    if done.returncode != 0:
        raise SystemExit(
            f"memctl {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[:300]}"
        )
    return done.stdout


def ask(env: dict, data: dict) -> list[list[int]]:
    """The hit ids of every question, in order."""
    batch = "".join(json.dumps({"query": q["q"], "k": max(KS)}) + "\n" for q in data["questions"])
    out = memctl(
        env, "episode", "search", "--batch", "-", "--format", "jsonl", "--no-track", stdin=batch
    )
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(answers) == len(data["questions"])
    if not any(h.get("vector_rank") for a in answers for h in a["results"]):
        raise SystemExit("the vector half did not run: is the local embedder installed?")
    return [[h["id"] for h in a["results"]] for a in answers]


def recalls(data: dict, ids: list[int], found: list[list[int]]) -> dict[int, float]:
    out = {}
    for k in KS:
        total = 0.0
        for question, hits in zip(data["questions"], found):
            wanted = {ids[a - 1] for a in question["answers"]}
            total += len(wanted & set(hits[:k])) / len(wanted)
        out[k] = total / len(data["questions"])
    return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="more [search] settings for a run with the kinds included, e.g. 'context_window=3h'",
    )
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="memctl-ops-kinds-"))
    loads = [(name, False) for name in SETS] + [("retrieval_log.json", True)]
    print(
        f"{'set (kinds)':<40} {'context_kinds':<44} "
        + " ".join(f"{'recall@' + str(k):>9}" for k in KS)
    )
    try:
        with server(args.database_url) as admin:
            for name, mixed in loads:
                data = json.loads((DATA / name).read_text())
                with fresh_database(admin) as url:
                    import psycopg

                    config = scratch / "memctl.toml"
                    env = {
                        **os.environ,
                        "MEMCTL_DATABASE_URL": url,
                        "MEMCTL_EMBEDDER": "local",
                        "MEMCTL_EMBED_MODEL": "all-minilm",
                        "MEMCTL_CONFIG": str(config),
                        "HF_HUB_OFFLINE": "1",
                    }
                    write_config(config, None, "")
                    lines = "".join(json.dumps(r) + "\n" for r in rows_of(data, mixed))
                    memctl(env, "episode", "import", "-", stdin=lines)
                    memctl(env, "embed")
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("ANALYZE episodes")
                        ids = [r[0] for r in conn.execute("SELECT id FROM episodes ORDER BY id")]
                    assert len(ids) == len(data["episodes"])
                    runs = [(label, kinds, "") for label, kinds in CONTEXT_KINDS]
                    runs += [(f"kinds included, {v}", CONTEXT_KINDS[2][1], v) for v in args.variant]
                    label = f"{name} ({'alert + observation' if mixed else 'observation'})"
                    for kinds_label, kinds, variant in runs:
                        write_config(config, kinds, variant)
                        started = time.perf_counter()
                        scores = recalls(data, ids, ask(env, data))
                        print(
                            f"{label:<40} {kinds_label:<44} "
                            + " ".join(f"{scores[k]:>9.3f}" for k in KS)
                            + f"   ({time.perf_counter() - started:.1f} s)",
                            flush=True,
                        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
