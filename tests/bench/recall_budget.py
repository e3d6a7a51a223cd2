"""Evidence within recall's budget: the share of questions whose evidence lies inside what `memctl recall` returns.

LoCoMo (../shared/eval/locomo-dev.json, retrieval.py's loading: every dialogue turn an episode, agent =
the conversation, kind conversation, created_at its session's date) is imported and embedded with
all-minilm through the Ollama protocol (tests/ollama_server.py, served from this process, as a running
Ollama would), then every question (categories 1-4 with evidence) is asked as one
`memctl recall --batch - -f jsonl --no-track -k 100 --max-tokens B` for each budget B in BUDGETS,
filtered to its conversation's agent. A question's evidence counts as inside when an item holds the
turn: an episode, a window's episode, or a near-duplicate folded into one (named by id). Printed per
split (dev: conv-26,30,41, the conversations [search] was tuned on; held out: conv-42,43) and budget:
any (at least one evidence turn inside), all (every one), mean (the mean share); beside them
`episode search --batch` top-10 turns (retrieval.py's recall@10) and the tokens those ten turns take.

The operations sets of tests/data (ops_kinds.py's loading, kind observation, times as labelled) are
asked the same way, one fresh database each, with the share of each question's answer entries inside
the returned context at each budget.

--variant "window_before=0 window_after=0" asks again with those [recall] settings, on the same data
(repeatable); `search.text_weight=0.4` sets a [search] setting (LoCoMo's searches then run again). The
figures of each variant are printed beside the defaults'.

Speed: `recall --batch` of --observations observations (the questions, cycled) ÷ `episode search --batch`
of the same texts as queries, both one process, defaults otherwise (recall k 5, budget 1000; search k 5):
goal <= 1.5.

--data none skips LoCoMo (the smoke test's tiny run: the LoCoMo file is outside the repository).

    python tests/bench/recall_budget.py [--data ../shared/eval/locomo-dev.json] [--variant "window_after=0"]
        [--observations 1000] [--embedder ollama|local]
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
OPS_SETS = ("retrieval.json", "retrieval_log.json", "retrieval_tokens.json")
BUDGETS = (250, 500, 1000, 1500)
DEV = ("conv-26", "conv-30", "conv-41")
HELD_OUT = ("conv-42", "conv-43")


def memctl(env: dict, *args: str, stdin: str | None = None) -> tuple[str, float]:
    command = [str(Path(sys.executable).with_name("memctl")), *args]
    started = time.perf_counter()
    done = subprocess.run(command, input=stdin, text=True, capture_output=True, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"memctl {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[:300]}"
        )
    return done.stdout, elapsed


def write_config(path: Path, variant: str) -> None:
    """search_timeout 300 (retrieval.py's reason) and the variant's settings: `key=value` in [recall],
    `search.key=value` in [search]."""
    sections: dict[str, list[str]] = {
        "embedding": ["search_timeout = 300"],
        "recall": [],
        "search": [],
    }
    for item in variant.split():
        key, _, value = item.partition("=")
        section, _, name = key.rpartition(".")
        bare = value.replace(".", "").isdigit() or value in ("true", "false")
        sections[section or "recall"].append(f"{name} = {value if bare else json.dumps(value)}")
    path.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"{line}\n" for line in lines) + "\n"
            for name, lines in sections.items()
        )
    )


def recall_batch(
    env: dict, asks: list[tuple[str | None, str]], budget: int, k: int = 100
) -> list[dict]:
    lines = "".join(
        json.dumps({"observation": q, **({"agent": a} if a else {})}) + "\n" for a, q in asks
    )
    out, _ = memctl(
        env,
        "recall",
        "--batch",
        "-",
        "-f",
        "jsonl",
        "--no-track",
        "-k",
        str(k),
        "--max-tokens",
        str(budget),
        stdin=lines,
    )
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(answers) == len(asks), f"{len(asks)} observations, {len(answers)} answers"
    bad = [a for a in answers if "error" in a]
    assert not bad, bad[:3]
    return answers


def ids_inside(answer: dict) -> set[int]:
    """Every episode id the returned context holds: items, windows' episodes, folded near-duplicates."""
    found = set()
    for item in answer["items"]:
        if item["kind"] == "episode":
            found.add(item["id"])
            found.update(item.get("duplicates") or [])
        elif item["kind"] == "window":
            found.update(item["ids"])
            for e in item["episodes"]:
                found.update(e.get("duplicates") or [])
    return found


def shares(wanted: list[set], found: list[set]) -> tuple[float, float, float]:
    """(any, all, mean share) over the questions."""
    n = len(wanted)
    return (
        sum(bool(w & f) for w, f in zip(wanted, found)) / n,
        sum(w <= f for w, f in zip(wanted, found)) / n,
        sum(len(w & f) / len(w) for w, f in zip(wanted, found)) / n,
    )


def episode_ids(url: str) -> dict[int, tuple[str, str]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE episodes")
        return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, agent, content FROM episodes")}


def locomo(args, admin, scratch: Path, base_env: dict, variants: list[str]) -> None:
    rows, turn_ids, questions = retrieval.load_locomo(args.data, None)
    with fresh_database(admin) as url:
        env = {**base_env, "MEMCTL_DATABASE_URL": url}
        write_config(scratch / "memctl.toml", "")
        started = time.perf_counter()
        memctl(env, "episode", "import", "-", stdin="".join(json.dumps(r) + "\n" for r in rows))
        memctl(env, "embed")
        by_id = episode_ids(url)
        print(
            f"{args.data.name}: {len(rows)} turns, {len(questions)} questions; loaded and embedded "
            f"({args.embedder} all-minilm) in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        # evidence turn ids as episode ids: a turn's text can be said twice, both count
        wanted = [
            {
                i
                for i, (agent, text) in by_id.items()
                if a == agent and turn_ids.get((agent, text), set()) & ev
            }
            for a, _, ev, _ in questions
        ]
        splits = {
            "dev": [i for i, q in enumerate(questions) if q[0] in DEV],
            "held out": [i for i, q in enumerate(questions) if q[0] in HELD_OUT],
        }
        search_answers = retrieval.ask(retrieval.memctl_command(None), env, questions, 10)[0]
        top10 = [{h["id"] for h in a["results"][:10]} for a in search_answers]
        tokens10 = [
            sum(-(-len(h["content"]) // 4) for h in a["results"][:10]) for a in search_answers
        ]
        for name, chosen in splits.items():
            w = [wanted[i] for i in chosen]
            a, al, m = shares(w, [top10[i] for i in chosen])
            mean_tokens = sum(tokens10[i] for i in chosen) / max(1, len(chosen))
            print(
                f"[search top-10 turns] {name} (n={len(chosen)}): any {a:.3f} all {al:.3f} mean {m:.3f}; "
                f"the ten turns' text {mean_tokens:.0f} tokens (characters / 4) a question",
                flush=True,
            )
        asks = [(agent, q) for agent, q, _, _ in questions]
        in_process(env, scratch, asks, wanted, splits, variants)
        # what an operator runs: the held-out questions through `memctl recall --batch`, defaults, 1000 tokens
        write_config(scratch / "memctl.toml", "")
        held = splits["held out"]
        started = time.perf_counter()
        found = [ids_inside(a) for a in recall_batch(env, [asks[i] for i in held], 1000)]
        a, al, m = shares([wanted[i] for i in held], found)
        print(
            f"[memctl recall --batch - --max-tokens 1000 -k 100 -f jsonl] held out: {len(held)} questions, "
            f"{len(found)} JSON lines; any {a:.3f} all {al:.3f} mean {m:.3f} ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        if args.observations:
            speed(env, [q for _, q, _, _ in questions], args.observations)


def in_process(env: dict, scratch: Path, asks, wanted, splits, variants: list[str]) -> None:
    """Every budget and variant on one search per question: recall's own code (recall_batch's steps), the
    search (which neither the budget nor the window settings change) run once."""
    from dataclasses import replace

    from memctl import config, db
    from memctl.recall import form, recall, recall_episodes, window

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = config.load()
        conn = db.connect(env["MEMCTL_DATABASE_URL"], vector=True)
        requests = [recall.Request(q, agent=a, k=100, track=False) for a, q in asks]
        started = time.perf_counter()
        found = recall_episodes.find_episodes(conn.use_settings(settings), requests)
        print(
            f"  (the {len(requests)} searches, k 300: {time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        for variant in variants:
            write_config(scratch / "memctl.toml", variant)
            chosen = config.load()
            if (
                "search." in variant
            ):  # the search itself changes: asked again (the defaults' kept for the next)
                found_here = recall_episodes.find_episodes(conn, chosen, requests)
            else:
                found_here = found
            made, rule = form.template(chosen), window.rule(chosen)
            for budget in BUDGETS:
                results = [
                    recall.assemble(
                        conn, chosen, replace(r, max_tokens=budget), budget, 0.0, made, rule, f
                    )
                    for r, f in zip(requests, found_here)
                ]
                inside = [ids_inside(plain(x.to_dict())) for x in results]
                for name, picked in splits.items():
                    a, al, m = shares([wanted[i] for i in picked], [inside[i] for i in picked])
                    print(
                        f"[recall {variant or 'defaults'}] {name} within {budget} tokens: any {a:.3f} all {al:.3f} "
                        f"mean {m:.3f}",
                        flush=True,
                    )
        conn.close()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plain(value):
    return json.loads(json.dumps(value, default=str))


def speed(env: dict, texts: list[str], n: int) -> None:
    chosen = [texts[i % len(texts)] for i in range(n)]
    searches = "".join(json.dumps({"query": t}) + "\n" for t in chosen)
    recalls = "".join(json.dumps({"observation": t}) + "\n" for t in chosen)
    times = {"search": [], "recall": []}
    for _ in range(1):  # one round each: 1,000 recalls take minutes on 2 shared cores
        times["search"].append(
            memctl(
                env,
                "episode",
                "search",
                "--batch",
                "-",
                "-f",
                "jsonl",
                "--no-track",
                stdin=searches,
            )[1]
        )
        times["recall"].append(
            memctl(env, "recall", "--batch", "-", "-f", "jsonl", "--no-track", stdin=recalls)[1]
        )
    s, r = min(times["search"]), min(times["recall"])
    print(
        f"recall --batch of {n} observations {r:.1f} s / episode search --batch of {n} queries {s:.1f} s: "
        f"ratio {r / s:.2f} (goal <= 1.5)",
        flush=True,
    )


def ops(admin, scratch: Path, base_env: dict, variants: list[str]) -> None:
    import ops_kinds

    for name in OPS_SETS:
        data = json.loads((DATA / name).read_text())
        with fresh_database(admin) as url:
            env = {**base_env, "MEMCTL_DATABASE_URL": url}
            write_config(scratch / "memctl.toml", "")
            memctl(
                env,
                "episode",
                "import",
                "-",
                stdin="".join(json.dumps(r) + "\n" for r in ops_kinds.rows_of(data, False)),
            )
            memctl(env, "embed")
            ids = sorted(episode_ids(url))
            wanted = [{ids[a - 1] for a in q["answers"]} for q in data["questions"]]
            asks = [(None, q["q"]) for q in data["questions"]]
            for variant in variants:
                write_config(scratch / "memctl.toml", variant)
                figures = []
                for budget in BUDGETS[:2]:
                    a, al, m = shares(
                        wanted, [ids_inside(x) for x in recall_batch(env, asks, budget)]
                    )
                    figures.append(f"{budget}: any {a:.3f} all {al:.3f} mean {m:.3f}")
                print(
                    f"[ops {name}] recall {variant or 'defaults'}: " + "; ".join(figures),
                    flush=True,
                )


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--data", default=str(retrieval.DEFAULT_DATA), help="LoCoMo JSON, or 'none' (ops sets only)"
    )
    p.add_argument(
        "--variant", action="append", default=[], help="[recall] settings, e.g. 'window_after=0'"
    )
    p.add_argument("--observations", type=int, default=1000, help="for the speed ratio (0: skip)")
    p.add_argument("--embedder", choices=("ollama", "local"), default="ollama")
    p.add_argument("--no-ops", action="store_true", help="skip the operations sets")
    args = p.parse_args()
    args.data = None if args.data == "none" else Path(args.data)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.pop(
        "MEMCTL_TEST_MINILM_PYTHON", None
    )  # the test server computes all-minilm in this process
    from ollama_server import OllamaTestServer

    scratch = Path(tempfile.mkdtemp(prefix="memctl-recall-budget-"))
    variants = [""] + args.variant
    try:
        with OllamaTestServer() as ollama, server(args.database_url) as admin:
            env = {
                **os.environ,
                "MEMCTL_EMBEDDER": args.embedder,
                "MEMCTL_EMBED_MODEL": "all-minilm",
                "MEMCTL_CONFIG": str(scratch / "memctl.toml"),
                "HF_HUB_OFFLINE": "1",
                "XDG_CACHE_HOME": str(scratch / "cache"),
            }
            if args.embedder == "ollama":
                env["OLLAMA_HOST"] = ollama.url
            if not args.no_ops:
                ops(admin, scratch, env, variants)
            if args.data is not None:
                locomo(args, admin, scratch, env, variants)
            if args.embedder == "ollama":
                assert ollama.requests, "nothing reached the Ollama-protocol server"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
