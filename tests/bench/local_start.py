"""Local embedder start: a fresh `memctl episode search` with the local embedder ÷ the same through Ollama.

Two databases hold the same N episodes with the same all-minilm vectors, one
registered for the local embedder, one for Ollama's all-minilm (served by
tests/ollama_server.py in this process, its model loaded and warm, as a running
Ollama would be). Each search runs as a fresh process, alternating, --runs times;
the ratio of the medians is printed. Goal: <= 2. Peak resident memory of one run
of each is printed too (the child's ru_maxrss).

The local search runs the installed `memctl` (LocalEmbedder on memctl.embedding.minilm,
weights verified once per file identity, remembered in a temporary cache dir).

A second measurement leaves memctl out: `python -c` that loads the model and
embeds one query through memctl.embedding.minilm ÷ the same through sentence-transformers.

A third is the embed worker's side: texts/s of memctl.embedding.minilm and of
sentence-transformers (torch's default threads) in this process, on batches of 32
and 64 chunks of about 200 words, alternating, median of --rounds.

    python tests/bench/local_start.py [--episodes 200] [--runs 11] [--rounds 3]
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import alternate, fresh_database, median, parser, server

# The second and third measurements need sentence-transformers (with torch); the first does not.
WITH_ST = importlib.util.find_spec("sentence_transformers") is not None
QUERY = "nginx deploy failed on web-3 and the disk is almost full, what should I do?"
SERVICES = "nginx postgres redis kafka api gateway billing auth search worker scheduler cdn dns vpn".split()
EVENTS = (
    "deploy failed",
    "restarted",
    "ran out of disk",
    "lagged behind",
    "hit the rate limit",
    "leaked memory",
    "lost its certificate",
    "timed out",
    "was scaled up",
    "rolled back",
    "paged the on-call",
    "was patched",
)
FIXES = (
    "rotating logs fixed it",
    "a rollback fixed it",
    "we added an index",
    "restarting the pod helped",
    "renewing the certificate fixed it",
    "nobody fixed it yet",
    "scaling out helped",
    "we paused the job",
)

ENCODE_NUMPY = """
import sys
from memctl.embedding import minilm
from memctl.embedding.local import bundled_model_dir
minilm.load(bundled_model_dir()).encode([sys.argv[1]])
"""
ENCODE_ST = """
import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
from sentence_transformers import SentenceTransformer
from memctl.embedding.local import bundled_model_dir
SentenceTransformer(str(bundled_model_dir()), device="cpu").encode([sys.argv[1]], normalize_embeddings=True)
"""


def sentence(rng: random.Random, i: int) -> str:
    return (
        f"{rng.choice(SERVICES)} on web-{rng.randint(1, 40)} {rng.choice(EVENTS)}; "
        f"{rng.choice(FIXES)} (ticket {i})"
    )


def load(url: str, settings, embedder, texts: list[str], vectors: list[list[float]]) -> None:
    """The episodes, one chunk each, with the given vectors under `embedder`'s model."""
    from pgvector import Vector
    from psycopg import sql

    from memctl import db
    from memctl.embedding import models
    from memctl.records import episodes

    with db.connect(url, vector=True) as conn:
        lines = (
            json.dumps({"content": t, "agent": f"agent{i % 3}"}).encode()
            for i, t in enumerate(texts)
        )
        result = episodes.ImportResult()
        episodes.import_episodes(
            conn.use_settings(settings),
            episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
            result=result,
        )
        model = models.register(conn, embedder, state="active", build_index=True)
        conn.execute("DELETE FROM embed_queue")
        by_text = dict(zip(texts, vectors))
        chunks = conn.execute(
            "SELECT agent, id, content, content_hash FROM chunks ORDER BY id"
        ).fetchall()
        with (
            conn.cursor() as cur,
            cur.copy(
                sql.SQL(
                    "COPY {} (agent, chunk_id, content_hash, embedding) FROM STDIN (FORMAT BINARY)"
                ).format(sql.Identifier(model.table_name))
            ) as cp,
        ):
            cp.set_types(["text", "int8", "bytea", "vector"])
            for row in chunks:
                cp.write_row(
                    (row["agent"], row["id"], row["content_hash"], Vector(by_text[row["content"]]))
                )
        conn.execute("VACUUM ANALYZE")


# A small parent for the measured command: a child forked from this (large) bench process would
# start its ru_maxrss at the bench's own size, which exec does not reset.
RSS_PARENT = """
import os, resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if code == 0 else -code)
"""


def peak_rss_mib(cmd: list[str], env: dict) -> float:
    """Peak resident memory of one fresh run of cmd (the child's ru_maxrss, KiB on Linux)."""
    out = subprocess.run(
        [sys.executable, "-c", RSS_PARENT, *cmd],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    kib = int(out.stdout)
    if kib <= 0:
        raise SystemExit(f"{cmd[:3]}... exited with {-kib}")
    return kib / 1024


def check_search(cmd: list[str], env: dict, label: str) -> None:
    """One run that must find vectors without a fallback warning: a text-only search would time nothing useful."""
    out = subprocess.run([*cmd, "-f", "json"], env=env, capture_output=True, text=True)
    if out.returncode != 0 or out.stderr.strip():
        raise SystemExit(
            f"{label} search failed or warned (exit {out.returncode}): {out.stderr.strip()}"
        )
    hits = json.loads(out.stdout)
    print(f"{label}: {len(hits) if isinstance(hits, list) else hits} hits, stderr empty")


def chunk(rng: random.Random, words: int = 200) -> str:
    parts: list[str] = []
    while sum(len(p.split()) for p in parts) < words:
        parts.append(sentence(rng, rng.randint(1, 99999)) + ".")
    return " ".join(parts)


def throughput(rounds: int) -> None:
    """texts/s of both implementations on the same batches, alternating."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    from memctl.embedding import minilm
    from memctl.embedding.local import bundled_model_dir

    ours = minilm.load(bundled_model_dir())
    theirs = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    rng = random.Random(9)
    texts = [chunk(rng) for _ in range(64)]
    tokens = sum(min(len(ids), minilm.MAX_TOKENS) for ids in ours.token_ids(texts)) / len(texts)
    print(
        f"\nthroughput, chunks of ~200 words ({tokens:.0f} tokens after truncation), median of {rounds}:"
    )
    ours.encode(texts[:8]), theirs.encode(texts[:8])
    for size in (32, 64):
        batch = texts[:size]
        mine, ref = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            theirs.encode(batch, batch_size=size, normalize_embeddings=True)
            ref.append(size / (time.perf_counter() - started))
            started = time.perf_counter()
            ours.encode(batch)
            mine.append(size / (time.perf_counter() - started))
        print(
            f"  batch {size}: memctl.embedding.minilm {median(mine):.1f} texts/s, sentence-transformers "
            f"{median(ref):.1f} texts/s, ratio {median(mine) / median(ref):.2f}"
        )


def report(name_a: str, a: list[float], name_b: str, b: list[float], goal: str) -> None:
    print(f"  {name_a}: median {median(a) * 1000:.0f} ms")
    print(f"  {name_b}: median {median(b) * 1000:.0f} ms")
    print(f"  ratio ({goal}): {median(a) / median(b):.2f}")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--rounds", type=int, default=3, help="throughput rounds (0: skip)")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ["MEMCTL_CONFIG"] = "/dev/null"
    os.environ.pop(
        "MEMCTL_TEST_MINILM_PYTHON", None
    )  # the test server computes all-minilm in this process
    from ollama_server import OllamaTestServer

    from memctl import config
    from memctl.embedding.local import LocalEmbedder, bundled_model_dir, file_sha256
    from memctl.embedding.ollama import OllamaEmbedder

    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    rng = random.Random(7)
    texts = [sentence(rng, i) for i in range(args.episodes)]
    settings = config.load()
    reference = LocalEmbedder()
    vectors = reference.embed(
        texts
    ).vectors  # also warms the test server's all-minilm (same process)
    with (
        OllamaTestServer() as ollama,
        server(args.database_url) as admin,
        fresh_database(admin) as local_url,
        fresh_database(admin) as ollama_url,
    ):
        load(local_url, settings, reference, texts, vectors)
        load(ollama_url, settings, OllamaEmbedder("all-minilm", host=ollama.url), texts, vectors)
        # The verified-weights cache goes to a temporary dir, not the operator's ~/.cache.
        env = {**os.environ, "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="memctl-bench-cache-")}
        local_env = [
            f"MEMCTL_DATABASE_URL={local_url}",
            "MEMCTL_EMBEDDER=local",
            "MEMCTL_EMBED_MODEL=all-minilm",
        ]
        ollama_env = [
            f"MEMCTL_DATABASE_URL={ollama_url}",
            "MEMCTL_EMBEDDER=ollama",
            "MEMCTL_EMBED_MODEL=all-minilm",
            f"OLLAMA_HOST={ollama.url}",
        ]
        ours = ["env", *local_env, exe, "episode", "search", QUERY]
        base = ["env", *ollama_env, exe, "episode", "search", QUERY]
        check_search(ours, env, "local")
        check_search(base, env, "ollama")
        ollama.requests.clear()
        mine, theirs = alternate(ours, base, env, args.runs)
        assert ollama.requests, "the Ollama-protocol search never reached the test server"
        rss_ours, rss_base = peak_rss_mib(ours, env), peak_rss_mib(base, env)

        if WITH_ST:
            encode_numpy = [sys.executable, "-c", ENCODE_NUMPY, QUERY]
            encode_st = [sys.executable, "-c", ENCODE_ST, QUERY]
            numpy_s, st_s = alternate(encode_numpy, encode_st, env, max(3, args.runs // 2), warm=1)
            rss_numpy, rss_st = peak_rss_mib(encode_numpy, env), peak_rss_mib(encode_st, env)
    weights = bundled_model_dir() / "model.safetensors"
    started = time.perf_counter()
    file_sha256(weights)
    sha_s = time.perf_counter() - started

    print(
        f"\nfresh `memctl episode search` ({args.episodes} episodes; local: memctl.embedding.minilm):"
    )
    report("local embedder ", mine, "Ollama protocol", theirs, "goal <= 2")
    print(f"  peak RSS: local {rss_ours:.0f} MiB, ollama client {rss_base:.0f} MiB")
    if not WITH_ST:
        print(
            "\nsentence-transformers is not installed here (`pip install torch==2.13.0 "
            "sentence-transformers`): its comparisons, load + one query and texts/s, are left out"
        )
        return
    print("\nfresh python: load the model + embed one query:")
    report(
        "memctl.embedding.minilm        ", numpy_s, "sentence-transformers", st_s, "lower is better"
    )
    print(
        f"  peak RSS: memctl.embedding.minilm {rss_numpy:.0f} MiB, sentence-transformers {rss_st:.0f} MiB"
    )
    print(
        f"\nsha256 of model.safetensors ({weights.stat().st_size / 2**20:.0f} MiB, page cache warm): "
        f"{sha_s * 1000:.0f} ms"
    )
    if args.rounds:
        throughput(args.rounds)


if __name__ == "__main__":
    main()
