"""Evidence recall@k of `memctl episode search` on LoCoMo-format conversations, through the CLI.

Runs what an operator runs, as fresh processes: `memctl episode import` of every
dialogue turn (agent = the conversation's sample_id, kind = conversation,
created_at = its session's date), `memctl embed`, then one `memctl episode
search --batch - --format jsonl --no-track` with every question of categories
1-4 that has evidence turns, filtered to its conversation's agent. A question
scores the share of its evidence turns found in its top k. Prints recall per
category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop: the data's codes, see
CATEGORIES), the mean and the mean
of each conversation, with each conversation's difference from the mean and its 95%
bootstrap interval (questions resampled: how far apart conversations can lie by the
sample of questions alone), and how often each would lie within 0.02 of the mean were the
conversations alike (questions shuffled across them).

By default it uses a fresh database on a temporary embedded server and the
local embedder with all-minilm (the network of Ollama's all-minilm); --embedder
ollama uses an Ollama-protocol server (OLLAMA_HOST or --ollama-host).

The configuration file it writes sets `[embedding] search_timeout = 300`, so
the query embeddings of the whole batch never hit the 2 s search timeout and
the vector half really runs (the bench measures ranking, not the timeout).
--variant runs the same questions again with [search] settings changed
("rrf_k=10 candidates=100"), on the same loaded database, so variants compare
in one run; each variant's difference from the defaults on the same questions
is printed with its 95% bootstrap interval and the questions it moved.
--conversations picks conversations by sample_id (a split to tune on, another
held out); only those are loaded. --halves asks again with each half alone
(--mode text, --mode vector): a conversation that lies under the mean by one
half and not by the other is hard for that half, not for the fusion; a plain
BM25 outside memctl (no dialogue terms, no database) is printed beside them.

    python tests/bench/retrieval.py [--data ../shared/eval/locomo-dev.json] [-k 10]
        [--conversations conv-26,conv-30] [--variant "rrf_k=60"] [--embedder local|ollama] [--halves]
        [--model M --ollama-host URL] [--embedding query_prefix= --embedding document_prefix=]
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from _common import fresh_database, parser, server

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "eval" / "locomo-dev.json"
# The codes of locomo10.json are not the order in which the paper lists the types: LoCoMo's own
# task_eval/evaluation.py scores category 1 by sub-answers (multi-hop) and asks category 2 for the
# conversation's date (temporal). The data agrees: 133 of the dev set's 156 category-2 questions
# begin "When" or "How long", category 1 has 2.9 evidence turns a question against 1.0-1.9 elsewhere,
# category 3 asks what someone "would likely" do.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def load_locomo(path: Path, wanted: set[str] | None):
    """(episode rows, (agent, text) -> dialogue ids, questions) of the chosen conversations."""
    rows, turn_ids, questions = [], defaultdict(set), []
    for sample in json.loads(path.read_text()):
        agent = sample["sample_id"]
        if wanted is not None and agent not in wanted:
            continue
        conv = sample["conversation"]
        for key, turns in conv.items():
            if not re.fullmatch(r"session_\d+", key) or not isinstance(turns, list):
                continue
            when = (
                datetime.strptime(conv[f"{key}_date_time"], "%I:%M %p on %d %B, %Y").isoformat()
                + "+00:00"
            )
            for t in turns:
                text = f"{t['speaker']}: {t['text']}"
                if t.get("blip_caption"):
                    text += f" [shares a photo of {t['blip_caption']}]"
                rows.append(
                    {
                        "content": text,
                        "kind": "conversation",
                        "source": "locomo",
                        "agent": agent,
                        "created_at": when,
                    }
                )
                turn_ids[(agent, text)].add(t["dia_id"])
        for qa in sample["qa"]:
            evidence = {e for e in qa.get("evidence", []) if re.fullmatch(r"D\d+:\d+", e)}
            if qa.get("category") in CATEGORIES and evidence:
                questions.append((agent, qa["question"], evidence, qa["category"]))
    return rows, turn_ids, questions


def memctl_command(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    beside = Path(sys.executable).with_name("memctl")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "memctl"]


def write_config(path: Path, variant: str, embedding: tuple[str, ...] = ()) -> None:
    """[embedding] search_timeout = 300 and `embedding`'s settings (strings: "query_prefix="), then the
    variant's [search] settings ("key=value key=value")."""
    lines = ["[embedding]", "search_timeout = 300"]
    for item in embedding:
        key, _, value = item.partition("=")
        if not re.fullmatch(r"[a-z_]+", key):
            raise SystemExit(f"--embedding: expected key=value, got {item!r}")
        lines.append(f"{key} = {json.dumps(value)}")
    lines += ["", "[search]"]
    for item in variant.split():
        key, _, value = item.partition("=")
        if not re.fullmatch(r"[a-z_]+", key) or not value:
            raise SystemExit(f"--variant: expected key=value, got {item!r}")
        lines.append(
            f"{key} = {value if re.fullmatch(r'[0-9.]+|true|false', value) else json.dumps(value)}"
        )
    path.write_text("\n".join(lines) + "\n")


def ask(
    memctl: list[str], env: dict, questions, k: int, mode: str = "hybrid"
) -> tuple[list[dict], float, str]:
    batch = "".join(
        json.dumps({"query": q, "agent": agent, "k": k, "mode": mode}) + "\n"
        for agent, q, _, _ in questions
    )
    started = time.perf_counter()
    done = subprocess.run(
        memctl + ["episode", "search", "--batch", "-", "--format", "jsonl", "--no-track"],
        input=batch,
        text=True,
        capture_output=True,
        env=env,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"memctl episode search failed ({done.returncode}): {done.stderr.strip()}")
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len(answers) == len(questions), f"{len(questions)} questions, {len(answers)} answers"
    return answers, elapsed, done.stderr.strip()


def score(
    questions, answers, turn_ids, k: int
) -> tuple[dict[int, list[float]], list[float], dict[str, list[float]]]:
    by_category: dict[int, list[float]] = defaultdict(list)
    by_conversation: dict[str, list[float]] = defaultdict(list)
    scores = []
    for (agent, _, evidence, category), answer in zip(questions, answers):
        found = set().union(
            *(turn_ids.get((agent, hit["content"]), set()) for hit in answer["results"][:k])
        )
        s = len(evidence & found) / len(evidence)
        scores.append(s)
        by_category[category].append(s)
        by_conversation[agent].append(s)
    return by_category, scores, by_conversation


_WORD = re.compile(r"[a-z0-9']+")
_STOP = frozenset(
    "a an the and or of to in on at for with is was were are be been did do does i you he she it they "
    "we my your his her their what when where who how why which that this have has had not".split()
)


def plain_bm25(rows, turn_ids, questions, k: int) -> list[float]:
    """Each question's recall@k by a plain BM25 (k1 1.2, b 0.75, lowercased words, a short stopword list)
    over its conversation's turns, outside memctl and PostgreSQL: a baseline that knows nothing of
    dialogue, for how hard a conversation is by its words alone."""
    import math
    from collections import Counter

    def words(text: str) -> list[str]:
        return [w for w in _WORD.findall(text.lower()) if w not in _STOP]

    turns = defaultdict(list)
    for r in rows:
        turns[r["agent"]].append(
            (Counter(words(r["content"])), turn_ids.get((r["agent"], r["content"]), set()))
        )
    scores = []
    for agent, question, evidence, _ in questions:
        docs = turns[agent]
        n = len(docs)
        average = sum(sum(tf.values()) for tf, _ in docs) / n
        terms = words(question)
        df = {t: sum(1 for tf, _ in docs if t in tf) for t in set(terms)}
        ranked = []
        for tf, ids in docs:
            length = sum(tf.values())
            score = sum(
                math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                * tf[t]
                * 2.2
                / (tf[t] + 1.2 * (0.25 + 0.75 * length / average))
                for t in terms
                if tf[t]
            )
            ranked.append((score, ids))
        ranked.sort(key=lambda r: -r[0])  # stable: ties keep the log's order
        found = set().union(*(ids for _, ids in ranked[:k]))
        scores.append(len(evidence & found) / len(evidence))
    return scores


RESAMPLES = 2000


def _interval(draw, resamples: int = RESAMPLES) -> tuple[float, float]:
    """The 95% percentile interval of `draw(rng)` over bootstrap resamples (seeded: reruns agree)."""
    rng = random.Random(0)
    values = sorted(draw(rng) for _ in range(resamples))
    return values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]


def _mean(values) -> float:
    return sum(values) / len(values)


def against_the_mean(
    by_conversation: dict[str, list[float]],
) -> dict[str, tuple[float, float, float]]:
    """Conversation -> (its mean - the mean of all questions, and that difference's 95% interval).

    Questions are resampled, within the conversation and within the rest: with 80-200 questions a
    conversation's mean has a standard error of about 0.03, so a difference smaller than its
    interval is the question sample's as much as the method's."""
    out = {}
    for conv, mine in by_conversation.items():
        rest = [s for c, v in by_conversation.items() if c != conv for s in v]
        if not rest:
            continue
        share = len(rest) / (len(mine) + len(rest))  # mine - all = (mine - rest) * share

        def draw(rng, mine=mine, rest=rest, share=share):
            return (
                _mean(rng.choices(mine, k=len(mine))) - _mean(rng.choices(rest, k=len(rest)))
            ) * share

        out[conv] = ((_mean(mine) - _mean(rest)) * share, *_interval(draw))
    return out


def alike_within(
    by_conversation: dict[str, list[float]], tolerance: float = 0.02, resamples: int = RESAMPLES
) -> tuple[dict[str, float], float]:
    """How often each conversation, and every one at once, lies within `tolerance` of the mean when
    conversations differ in nothing but their questions: the questions' scores shuffled across the
    conversations, each keeping its size (a permutation test, seeded). What a method equally good on
    every conversation would meet, by the question sample alone."""
    rng = random.Random(0)
    pooled = [s for v in by_conversation.values() for s in v]
    mean = _mean(pooled)
    sizes = {conv: len(v) for conv, v in sorted(by_conversation.items())}
    hits, every = dict.fromkeys(sizes, 0), 0
    for _ in range(resamples):
        rng.shuffle(pooled)
        start, inside = 0, True
        for conv, n in sizes.items():
            near = abs(_mean(pooled[start : start + n]) - mean) <= tolerance
            hits[conv] += near
            inside &= near
            start += n
        every += inside
    return {conv: h / resamples for conv, h in hits.items()}, every / resamples


def paired(before: list[float], after: list[float]) -> tuple[float, float, float, int, int]:
    """after - before on the same questions: the mean difference, its 95% interval, questions up, down."""
    diffs = [b - a for a, b in zip(before, after)]
    lo, hi = _interval(lambda rng: _mean(rng.choices(diffs, k=len(diffs))))
    return _mean(diffs), lo, hi, sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format JSON (default: %(default)s)"
    )
    p.add_argument("-k", type=int, default=10)
    p.add_argument(
        "--conversations", help="comma-separated sample_ids to load and ask (default: all)"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="[search] settings for another run on the same data, e.g. 'rrf_k=10' (repeatable)",
    )
    p.add_argument("--embedder", choices=("local", "ollama"), default="local")
    p.add_argument("--model", default="all-minilm")
    p.add_argument("--ollama-host", default=os.environ.get("OLLAMA_HOST"))
    p.add_argument(
        "--embedding",
        action="append",
        default=[],
        help="an [embedding] string setting, e.g. 'query_prefix=' (no query instruction; repeatable)",
    )
    p.add_argument("--memctl", help="the memctl command (default: the one beside this Python)")
    p.add_argument(
        "--halves",
        action="store_true",
        help="also ask with each half alone (--mode text, --mode vector), default settings: how far "
        "apart the conversations lie by words alone and by meaning alone",
    )
    args = p.parse_args()
    wanted = set(args.conversations.split(",")) if args.conversations else None
    rows, turn_ids, questions = load_locomo(args.data, wanted)
    if not questions:
        raise SystemExit("no questions: check --data and --conversations")
    memctl = memctl_command(args.memctl)
    scratch = Path(tempfile.mkdtemp(prefix="memctl-retrieval-"))
    try:
        with server(args.database_url) as admin, fresh_database(admin) as url:
            env = {
                **os.environ,
                "MEMCTL_DATABASE_URL": url,
                "MEMCTL_EMBEDDER": args.embedder,
                "MEMCTL_EMBED_MODEL": args.model,
                "MEMCTL_CONFIG": str(scratch / "memctl.toml"),
                "HF_HUB_OFFLINE": "1",
            }
            if args.ollama_host:
                env["OLLAMA_HOST"] = args.ollama_host
            write_config(scratch / "memctl.toml", "", tuple(args.embedding))
            (scratch / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            started = time.perf_counter()
            for step in (["episode", "import", str(scratch / "turns.jsonl")], ["embed"]):
                subprocess.run(memctl + step, env=env, check=True, stdout=subprocess.DEVNULL)
            convs = len({r["agent"] for r in rows})
            print(
                f"{args.data.name}: {convs} conversations, {len(rows)} turns, {len(questions)} questions; "
                f"loaded and embedded ({args.embedder} {args.model}) in {time.perf_counter() - started:.0f} s"
            )
            first = None
            runs = [(variant, variant, "hybrid") for variant in [""] + args.variant]
            if args.halves:
                runs += [("", "text half alone", "text"), ("", "vector half alone", "vector")]
            for variant, label, mode in runs:
                write_config(scratch / "memctl.toml", variant, tuple(args.embedding))
                answers, elapsed, stderr = ask(memctl, env, questions, args.k, mode)
                by_category, scores, by_conversation = score(questions, answers, turn_ids, args.k)
                vector_ran = sum(
                    1 for a in answers for h in a["results"] if h.get("vector_rank") is not None
                )
                label = label or "defaults"
                print(
                    f"[{label}] recall@{args.k} by category: "
                    + " ".join(
                        f"{c} {CATEGORIES[c]}={sum(v) / len(v):.3f} (n={len(v)})"
                        for c, v in sorted(by_category.items())
                    )
                    + f"; batch {elapsed:.1f} s"
                    + ("" if vector_ran or mode == "text" else "; VECTOR HALF DID NOT RUN")
                )
                if stderr:
                    print(f"  stderr: {stderr[:300]}")
                print(
                    f"[{label}] mean recall@{args.k}: {sum(scores) / len(scores):.3f}; by conversation: "
                    + " ".join(
                        f"{c}={sum(v) / len(v):.3f}" for c, v in sorted(by_conversation.items())
                    )
                )
                spread = against_the_mean(by_conversation)
                if spread:
                    print(
                        f"[{label}] each conversation minus the mean (95% bootstrap interval): "
                        + " ".join(
                            f"{c} {d:+.3f} ({lo:+.3f}..{hi:+.3f})"
                            for c, (d, lo, hi) in sorted(spread.items())
                        )
                    )
                if first is None:
                    first = scores
                    if len(by_conversation) > 1:
                        chance, every = alike_within(by_conversation)
                        print(
                            f"[{label}] chance of lying within 0.02 of the mean were the conversations alike "
                            "(questions shuffled across them): "
                            + " ".join(f"{c} {p:.2f}" for c, p in chance.items())
                            + f"; all at once {every:.2f}"
                        )
                else:
                    d, lo, hi, up, down = paired(first, scores)
                    print(
                        f"[{label}] minus defaults, same questions: {d:+.4f} (95% {lo:+.4f}..{hi:+.4f}); "
                        f"{up} questions up, {down} down"
                    )
            if args.halves:
                scores = plain_bm25(rows, turn_ids, questions, args.k)
                by_conversation = defaultdict(list)
                for (agent, _, _, _), s in zip(questions, scores):
                    by_conversation[agent].append(s)
                print(
                    f"[plain BM25, outside memctl] mean recall@{args.k}: {sum(scores) / len(scores):.3f}; "
                    "each conversation minus the mean (95% bootstrap interval): "
                    + " ".join(
                        f"{c} {d:+.3f} ({lo:+.3f}..{hi:+.3f})"
                        for c, (d, lo, hi) in sorted(against_the_mean(by_conversation).items())
                    )
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
