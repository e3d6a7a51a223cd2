"""Memory held flat over time: the resident set of the long-running processes at start, settled and end.

Three installed `memctl` processes, each driven to the end of its work by this script, their RSS (VmRSS of
/proc/PID/status) read as the work goes:

  - `memctl mcp --http` answering --calls tool calls (search, remember, fact_set, fact_get, recall in turn) of
    one registered agent, over HTTP with its bearer token;
  - `memctl ingest FILE --follow` taking --lines lines appended to FILE as it reads them;
  - `memctl embed --loop` embedding --batches batches of --batch-size chunks (the hash embedder), more
    episodes written between its passes.

Printed per process: RSS at start (its first work done), settled (after --warm of its work), at the end,
and the growth from settled to end (goal: within 10%). The figure is the process's own; no baseline is
needed beside it, as none shrinks or grows with the machine.

    python tests/bench/rss.py [--calls 20000] [--lines 1000000] [--batches 50] [--batch-size 64] [--warm 0.2]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import embedder_env, fresh_database, parser, server

WORDS = "deploy disk full nginx logs rotated postgres replica lag redis eviction memory queue backlog".split()


def rss(pid: int) -> int:
    """Resident set of PID in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def exe() -> str:
    found = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    return found


class Track:
    """RSS at the first work done, once --warm of the work is done, and at the end."""

    def __init__(self, name: str, pid: int, total: int, warm: float):
        self.name, self.pid, self.total, self.warm_at = name, pid, total, max(1, int(total * warm))
        self.start = self.settled = self.end = None
        self.peak = 0

    def at(self, done: int) -> None:
        now = rss(self.pid)
        self.peak = max(self.peak, now)
        if self.start is None and done > 0:
            self.start = now
        if self.settled is None and done >= self.warm_at:
            self.settled = now
        self.end = now

    def line(self, unit: str) -> str:
        growth = (self.end - self.settled) / self.settled
        return (
            f"{self.name:22} {self.total:>9,} {unit:8} start {self.start / 1024:6.1f} MiB, settled "
            f"{self.settled / 1024:6.1f} MiB, end {self.end / 1024:6.1f} MiB, peak {self.peak / 1024:6.1f} MiB: "
            f"growth settled to end {growth:+.1%} (goal within 10%)"
        )


@contextlib.contextmanager
def started(argv: list[str], env: dict):
    """A memctl process for the length of the block, stopped with SIGTERM at its end."""
    proc = subprocess.Popen(
        [exe(), *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def alive(proc: subprocess.Popen, what: str) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited {proc.returncode}")


def wait_port(port: int, proc: subprocess.Popen) -> None:
    import socket

    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"memctl mcp --http exited {proc.returncode}")
            time.sleep(0.1)
    raise RuntimeError("memctl mcp --http never listened")


def mcp_http(env: dict, calls: int, warm: float) -> Track:
    import socket

    import httpx

    run = lambda *a: subprocess.run(
        [exe(), *a], env=env, check=True, capture_output=True, text=True
    )  # noqa: E731
    run("agent", "add", "bench")
    token = run("agent", "token", "bench").stdout.strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with started(["mcp", "--http", f"127.0.0.1:{port}"], env) as proc:
        track = Track("mcp --http", proc.pid, calls, warm)
        wait_port(port, proc)
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        tools = [
            (
                "remember",
                lambda i: {
                    "content": f"call {i}: {' '.join(WORDS[i % 7 : i % 7 + 6])} on host{i % 40}"
                },
            ),
            ("search", lambda i: {"query": f"{WORDS[i % 13]} on host{i % 40}", "k": 5}),
            ("fact_set", lambda i: {"key": f"host{i % 40}.state", "value": f"state {i}"}),
            ("fact_get", lambda i: {"key": f"host{i % 40}.state"}),
            (
                "recall",
                lambda i: {
                    "observation": f"{WORDS[i % 13]} trouble on host{i % 40}",
                    "max_tokens": 300,
                },
            ),
        ]
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as client:
            for i in range(calls):
                name, arguments = tools[i % len(tools)]
                body = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": name, "arguments": arguments(i)},
                }
                answer = client.post("/mcp", json=body)
                if answer.status_code != 200 or "error" in answer.json():
                    raise RuntimeError(
                        f"call {i} ({name}): {answer.status_code} {answer.text[:300]}"
                    )
                if i % 50 == 0 or i == calls - 1:
                    track.at(i + 1)
    return track


def ingest_follow(env: dict, url: str, lines: int, warm: float, chunk: int = 20_000) -> Track:
    from memctl import db

    work = Path(tempfile.mkdtemp(prefix="memctl-rss-"))
    log = work / "app.log"
    log.touch()
    written = 0
    argv = [
        "ingest",
        str(log),
        "--follow",
        "--source",
        "app",
        "--flush",
        "1",
        "--cursor-file",
        str(work / "app.cursor"),
    ]
    with started(argv, env) as proc, db.connect(url) as conn, open(log, "a") as out:
        track = Track("ingest --follow", proc.pid, lines, warm)
        while True:
            stored = conn.execute(
                "SELECT count(*) AS n FROM episodes WHERE source = 'app'"
            ).fetchone()["n"]
            track.at(stored)
            if stored >= lines:
                break
            if written - stored < 2 * chunk and written < lines:  # keep it fed, never far ahead
                n = min(chunk, lines - written)
                out.write(
                    "".join(
                        f"{written + j} {WORDS[(written + j) % 14]} request took "
                        f"{(written + j) % 997} ms on host{(written + j) % 40}\n"
                        for j in range(n)
                    )
                )
                out.flush()
                written += n
            alive(proc, "ingest")
            time.sleep(0.2)
    shutil.rmtree(work, ignore_errors=True)
    return track


def embed_loop(env: dict, url: str, batches: int, batch_size: int, warm: float) -> Track:
    from memctl import db

    def add(n: int, offset: int) -> None:
        rows = "".join(
            json.dumps(
                {"content": f"episode {offset + i}: {' '.join(WORDS[(offset + i) % 7 :][:6])}"}
            )
            + "\n"
            for i in range(n)
        )
        subprocess.run(
            [exe(), "episode", "import", "-"],
            env=env,
            input=rows.encode(),
            check=True,
            capture_output=True,
        )

    add(1, -1)  # the model registered first, so that what is written next is queued for it
    subprocess.run([exe(), "embed"], env=env, check=True, capture_output=True)
    per_pass = batch_size * 5  # five batches a pass; more written before each next pass
    add(per_pass, 0)
    total = per_pass
    with (
        started(
            ["embed", "--loop", "--interval", "1", "--batch-size", str(batch_size)], env
        ) as proc,
        db.connect(url) as conn,
    ):
        track = Track("embed --loop", proc.pid, batches, warm)
        while True:
            queued = conn.execute("SELECT count(*) AS n FROM embed_queue").fetchone()["n"]
            done = (total - queued) // batch_size
            track.at(done)
            if done >= batches:
                break
            if queued == 0:
                add(min(per_pass, (batches - done) * batch_size), total)
                total += min(per_pass, (batches - done) * batch_size)
            alive(proc, "embed")
            time.sleep(0.1)
    return track


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--warm",
        type=float,
        default=0.2,
        help="share of the work after which RSS counts as settled",
    )
    a = p.parse_args()
    env = embedder_env("hash", "hash-embed")
    runs = [
        (lambda url: mcp_http(env, a.calls, a.warm), "calls"),
        (lambda url: ingest_follow(env, url, a.lines, a.warm), "lines"),
        (lambda url: embed_loop(env, url, a.batches, a.batch_size, a.warm), "batches"),
    ]
    tracks = []
    with server(a.database_url) as admin:
        for run, unit in runs:
            with fresh_database(admin) as url:  # each process on a memory of its own
                env["MEMCTL_DATABASE_URL"] = os.environ["MEMCTL_DATABASE_URL"] = url
                tracks.append(run(url))
                print(tracks[-1].line(unit), flush=True)
    worst = max((t.end - t.settled) / t.settled for t in tracks)
    print(f"largest growth settled to end: {worst:+.1%} (goal within 10%)")


if __name__ == "__main__":
    main()
