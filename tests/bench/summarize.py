"""Peak memory of `memctl summarize` on one agent-day of N episodes against one of N / 10.

    python tests/bench/summarize.py                      # 100,000 and 10,000 episodes
    python tests/bench/summarize.py --episodes 300000    # and 30,000

Loads two agent-days into one fresh database with `memctl episode import` (one agent with N episodes on one
UTC day 40 days ago, another with N / 10 on the same day), then runs `memctl summarize --agent A` for each as
a subprocess and reads that process's peak resident set size (ru_maxrss from wait4). Goal: the ratio of the
two peaks is about 1, i.e. memory does not grow with the day.

The chat model is the Ollama-protocol test server (tests/ollama_server.py) with its extractive stand-in cut
to the length of a real model's answer: it keeps the first sentence of every ANSWER_EVERY-th line, at most
ANSWER_CHARS characters (the stand-in alone answers with the first sentence of every line, so the summary of
a large day would never fit one answer). It prints the requests, parts and rounds of each summary and checks
that the lineage holds every episode. Nothing is asserted: a measurement, not a test.

Server: MEMCTL_TEST_DATABASE_URL or --database-url (a role with CREATEDB), else an embedded server started in
a temporary MEMCTL_HOME and removed afterwards.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import WORDS, fresh_database, parser, server

from tests.ollama_server import OllamaTestServer

ANSWER_EVERY = 6
ANSWER_CHARS = (
    2000  # about 500 tokens: a real model's summary of a 2,300-token part, well under num_predict
)
CONFIG = '[retention]\nraw = "30d"\nsummary = "365d"\n\n[summarize]\nmodel = "llama3.2:3b"\n'


class BoundedChat(OllamaTestServer):
    """The test server, its chat answers cut to a real model's length."""

    def _chat(self, body):
        answer = super()._chat(body)
        kept = answer["message"]["content"].splitlines()[::ANSWER_EVERY]
        text = "\n".join(kept)[:ANSWER_CHARS]
        answer["message"]["content"] = (
            text[: text.rfind("\n")] if len(text) == ANSWER_CHARS else text
        )
        answer["eval_count"] = max(1, len(answer["message"]["content"]) // 4)
        return answer


def day_rows(agent: str, n: int, day: datetime.datetime, rng: random.Random):
    """n episodes of about 190 characters, three sentences each, spread over one UTC day."""
    step = 86_400 / n
    for i in range(n):
        detail = " ".join(rng.choice(WORDS) for _ in range(8))
        text = (
            f"Restarted worker {i % 50} after error E{i % 977} on host web{i % 13}. Queue backlog was {i} "
            f"items; {detail}. Checked disk, memory and replica lag afterwards: nominal."
        )
        yield {
            "content": text,
            "kind": "raw",
            "agent": agent,
            "source": f"agent:{agent}",
            "importance": 1 + i % 9,
            "created_at": (day + datetime.timedelta(seconds=i * step)).isoformat(),
        }


def peak_of(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(peak RSS in MiB, wall seconds, stdout) of one command run as a child process."""
    out = tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    err = proc.stderr.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err}")
    out.seek(0)
    return usage.ru_maxrss / 1024, seconds, out.read().decode()


def main() -> None:
    p = parser(__doc__)
    p.add_argument(
        "--episodes", type=int, default=100_000, help="the large day; the small one has a tenth"
    )
    args = p.parse_args()
    sizes = {"small": args.episodes // 10, "large": args.episodes}
    exe = str(Path(sys.executable).parent / "memctl")
    workdir = Path(tempfile.mkdtemp(prefix="memctl-bench-summarize-"))
    day = datetime.datetime.combine(
        datetime.date.today() - datetime.timedelta(days=40), datetime.time(), datetime.timezone.utc
    )
    rng = random.Random(7)
    data = workdir / "episodes.jsonl"
    with data.open("w") as f:
        for name, n in sizes.items():
            for row in day_rows(f"day-{name}", n, day, rng):
                f.write(json.dumps(row) + "\n")
    (workdir / "config.toml").write_text(CONFIG)
    results = {}
    try:
        with (
            server(args.database_url) as admin,
            fresh_database(admin) as url,
            BoundedChat() as chat,
        ):
            env = {
                **os.environ,
                "MEMCTL_DATABASE_URL": url,
                "MEMCTL_CONFIG": str(workdir / "config.toml"),
                "MEMCTL_EMBEDDER": "ollama",
                "MEMCTL_EMBED_MODEL": "all-minilm",
                "OLLAMA_HOST": chat.url,
            }
            subprocess.run(
                [exe, "episode", "import", str(data)], env=env, check=True, capture_output=True
            )
            for name, n in sizes.items():
                before = len(chat.chat_requests())
                peak, seconds, out = peak_of(
                    [exe, "summarize", "--agent", f"day-{name}", "-f", "json"], env
                )
                [written] = json.loads(out)
                meta = _meta(url, written["summary_id"])
                results[name] = peak
                print(
                    f"{n:>9,} episodes: peak RSS {peak:7.1f} MiB, {seconds:6.1f} s, "
                    f"{len(chat.chat_requests()) - before} chat requests, parts {meta['parts']}, "
                    f"rounds {meta['rounds']}, lineage {meta['lineage']:,} of {n:,}"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"peak RSS ratio {sizes['large']:,} / {sizes['small']:,} episodes (goal about 1): "
        f"{results['large'] / results['small']:.2f}"
    )


def _meta(url: str, summary_id: int) -> dict:
    from memctl import db

    with db.connect(url) as conn:
        row = conn.execute("SELECT meta FROM episodes WHERE id = %s", (summary_id,)).fetchone()
        lineage = conn.execute(
            "SELECT count(*) AS n FROM summary_sources WHERE summary_id = %s", (summary_id,)
        ).fetchone()["n"]
    return {**row["meta"], "lineage": lineage}


if __name__ == "__main__":
    main()
