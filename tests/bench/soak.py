"""Soak: memctl under steady writes, embedding, search and upkeep while faults are injected on a schedule.

    .venv/bin/python tests/bench/soak.py --minutes 30         # as root
    .venv/bin/python tests/bench/soak.py --profile short      # 2 minutes (tests/test_soak.py runs this)

The installed `memctl` (beside this Python, else on PATH) runs in subprocesses, as an operator's
timers and scripts would, against an embedded PostgreSQL whose MEMCTL_HOME is a size-limited tmpfs
mounted for the run, and the Ollama-protocol test server (tests/ollama_server.py) in this process.

Actors, each a thread that runs one command after another:
  writers   `episode add` (a quarter of them 35-45 days old, kind `old`), `episode import` of a
            batch, `fact set`; each write carries unique tokens, and exit 0 is an acknowledgement
  readers   `episode search`
  workers   two `memctl embed` runs at a time, each restarted when it ends, as a timer would
  upkeep    `summarize` (when the test server has a chat model), `prune --yes` ([retention] old =
            30d: the old episodes are summarized, then pruned) and `backup --to` (when the command
            exists), on a short schedule
Faults, in turn, every --fault-every seconds: kill -9 of an embed worker, of an import inside its
transaction (its COPY seen in pg_stat_activity), of the postmaster; the Ollama server stopped and
restarted; the data filesystem filled to the last byte, held, then freed.

At the end (Ollama up, space free, the queue drained): every acknowledged write present exactly once
(an old episode pruned after a summary holds it counts as present), an import all or nothing, no
orphaned chunk, every chunk embedded or failed with a reason, summary lineage consistent, no
traceback on any stderr, no command exiting with a code the moment does not explain (EXPECTED_EXITS: 3 while
the server or Ollama is away, 5 on a full disk; any other, 1 included, fails the soak), every kind of write
acknowledged at least once, and the server stopping and starting clean. Prints the figures; exit 0 when every
check holds and every kind of fault was injected. Root only (it mounts a filesystem).

Two topologies (--topology):
  standard  the embedded server started on demand by the first command that needs it (kill -9 of the
            postmaster: the next command starts it again)
  managed   `memctl db serve` owns the server (DESIGN.md decision 9), run by a supervisor loop here as
            memctl-db.service's Restart= would; commands never start a server and exit 3 while it is down.
            Its fault is kill_serve: kill -9 of serve's whole process group (systemd kills the unit's
            cgroup), then the supervisor restarts it after a second. As root, serve runs the server as
            the owner of MEMCTL_HOME: a system user (memctl_tsrv, as tests/test_db_serve.py uses)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAULT_KINDS = ("kill_embed_worker", "kill_import", "ollama_restart", "kill_postmaster", "disk_full")
TOPOLOGY_FAULTS = {
    "standard": FAULT_KINDS,
    "managed": ("kill_embed_worker", "kill_import", "ollama_restart", "kill_serve", "disk_full"),
}
SERVER_USER = "memctl_tsrv"  # owns a managed home, as tests/test_db_serve.py's
SERVE_READY = "memctl: embedded database ready"
WRITES = ("episode", "import", "fact")
PROFILES = {"short": 2.0, "full": 30.0}
VOCABULARY = (
    "disk",
    "deploy",
    "nginx",
    "rotated",
    "failed",
    "restart",
    "replica",
    "volume",
    "alert",
    "queue",
    "backlog",
    "kernel",
    "memory",
    "ticket",
    "cleanup",
    "retention",
    "snapshot",
    "latency",
    "upgrade",
)
TOKEN = r"soak[0-9a-f]{4}q[0-9]{7}"
EMBED_MODEL = (
    "nomic-embed-text"  # the test server's deterministic stand-in: cheap, so CPU goes to memctl
)
EXPECTED_EXITS = {0, 3, 5}  # ok, unavailable (a restart in progress, Ollama down), disk full


@dataclass
class Run:
    actor: str
    command: str
    rc: int
    t0: float
    t1: float
    out: str
    err: str
    killed: bool = False


@dataclass
class Fault:
    kind: str
    start: float
    end: float = 0.0
    detail: str = ""
    recovery_s: float | None = None


@dataclass
class Batch:
    tokens: list[str]
    acked: bool = False
    killed: bool = False


@dataclass
class State:
    runs: list[Run] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    acked: dict[str, dict[str, tuple]] = field(default_factory=lambda: {w: {} for w in WRITES})
    batches: list[Batch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, args) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.run_id = f"{self.rng.randrange(16**4):04x}"
        self.state = State()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.procs: dict[
            str, tuple[subprocess.Popen, float]
        ] = {}  # actor: (its command now, started)
        self.killed: set[int] = set()
        self.counter = 0
        self.exe = _memctl()
        self.mount = Path(tempfile.mkdtemp(prefix="memctl-soak-", dir="/var/tmp"))
        self.work = Path(tempfile.mkdtemp(prefix="memctl-soak-work-", dir="/var/tmp"))
        self.home = self.mount / "home"
        self.filler = self.mount / "filler"
        self.chat_model: str | None = None
        self.backup = False
        self.mounted = False
        self.ollama = None
        self.faults = TOPOLOGY_FAULTS[args.topology]
        self.managed = args.topology == "managed"
        self.serve: subprocess.Popen | None = None  # managed: `memctl db serve` now
        self.serve_held = threading.Event()  # managed: set while the supervisor must not restart it
        self.serve_done = threading.Event()  # managed: set at the end: the supervisor ends
        self.serve_log = self.work / "serve.log"
        self.serve_starts = 0

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        from tests.ollama_server import ModelSpec, OllamaTestServer, _hash_fn

        made = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.args.disk_mb}m,mode=0755",
                "tmpfs",
                str(self.mount),
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(
                f"soak: cannot mount a tmpfs at {self.mount}: {made.stderr.strip()} (needs root)"
            )
        self.mounted = True

        class Server(OllamaTestServer):  # notes when each embedding request arrived
            def _record(self, path, body):
                super()._record(path, body)
                if path == "/api/embed":
                    self.embed_times.append(time.monotonic())

        self.ollama = Server(
            {EMBED_MODEL: ModelSpec(768, 2048, _hash_fn(EMBED_MODEL, 768), "nomic-bert")}
        )
        self.ollama.embed_times = []
        self.ollama.start()
        self.chat_model = next(iter(self.ollama.chat_models), None)
        config = self.work / "config.toml"
        summarize = (
            f'[summarize]\nmodel = "{self.chat_model}"\nafter = "1d"\n' if self.chat_model else ""
        )
        config.write_text(
            f'[embedding]\nembedder = "ollama"\nmodel = "{EMBED_MODEL}"\ntimeout = 20\n'
            f'{summarize}[retention]\nold = "30d"\n'
        )
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("MEMCTL_", "PG", "OLLAMA_"))
        }
        self.env.update(
            MEMCTL_HOME=str(self.home), MEMCTL_CONFIG=str(config), OLLAMA_HOST=self.ollama.url
        )
        os.environ["MEMCTL_HOME"] = str(
            self.home
        )  # for memctl.db.embedded.status() in this process
        if self.managed:
            self.start_managed()
        first = self.memctl("setup", ["fact", "set", "soak.start", self.run_id])
        if first.rc != 0:
            raise SystemExit(f"soak: the first command failed ({first.rc}): {first.err.strip()}")
        probe = self.memctl("setup", ["backup", "--help"])
        self.backup = probe.rc == 0
        if not self.backup:
            self.note(
                f"backup step skipped: `memctl backup --help` exits {probe.rc} (no backup command here)"
            )
        if not self.chat_model:
            self.note("summarize step skipped: the test server has no chat model")

    def teardown(self) -> None:
        self.stop.set()
        with self.lock:
            live = [proc for proc, _ in self.procs.values()]
        for proc in live:  # interrupted: the commands still running end before the unmount
            proc.terminate()
        if self.ollama is not None:
            self.ollama.stop()
        if self.managed:
            self.serve_done.set()
            self.stop_serve()
        if self.mounted:
            if not self.managed:
                self.memctl("teardown", ["db", "stop"])
            if subprocess.run(["umount", str(self.mount)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", str(self.mount)], check=False)
        if not self.args.keep:
            self.mount.rmdir()
            shutil.rmtree(self.work, ignore_errors=True)

    # ------------------------------------------------------- managed topology

    def start_managed(self) -> None:
        import pwd

        try:
            owner = pwd.getpwnam(SERVER_USER)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--user-group",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    SERVER_USER,
                ],
                check=True,
                capture_output=True,
            )
            owner = pwd.getpwnam(SERVER_USER)
        self.home.mkdir(mode=0o750)
        os.chown(self.home, owner.pw_uid, owner.pw_gid)
        threading.Thread(target=self.supervisor, name="supervisor", daemon=True).start()
        self.wait_served(self.serve_log_size(0))

    def supervisor(self) -> None:
        """memctl-db.service: run `db serve`; when it ends (killed, failed), start it again a second later."""
        while not self.serve_done.is_set():
            if self.serve_held.is_set():
                time.sleep(0.1)
                continue
            with open(self.serve_log, "a") as log:
                proc = subprocess.Popen(
                    [self.exe, "db", "serve"],
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.serve, self.serve_starts = proc, self.serve_starts + 1
            proc.wait()
            self.serve_done.wait(1.0)  # RestartSec=1

    def serve_log_size(self, default: int = 0) -> int:
        return self.serve_log.stat().st_size if self.serve_log.exists() else default

    def wait_served(self, offset: int, seconds: float = 120) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if (
                self.serve_log.exists()
                and SERVE_READY in self.serve_log.read_text(errors="replace")[offset:]
            ):
                return True
            time.sleep(0.1)
        return False

    def stop_serve(self) -> int | None:
        """SIGTERM (the unit's stop: a fast clean shutdown); the supervisor does not restart it."""
        self.serve_held.set()
        proc = self.serve
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    # ----------------------------------------------------------------- running

    def memctl(
        self, actor: str, args: list[str], input: str | None = None, timeout: float = 600
    ) -> Run:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [self.exe, *args],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with self.lock:
            self.procs[actor] = (proc, t0)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\nsoak: killed after {timeout:.0f} s"
        with self.lock:
            self.procs.pop(actor, None)
            killed = proc.pid in self.killed
        run = Run(
            actor, " ".join(args[:2]), proc.returncode, t0, time.monotonic(), out, err, killed
        )
        with self.lock:
            self.state.runs.append(run)
        return run

    def note(self, text: str) -> None:
        print(f"soak: {text}", file=sys.stderr, flush=True)
        self.state.notes.append(text)

    def token(self) -> str:
        with self.lock:
            self.counter += 1
            return f"soak{self.run_id}q{self.counter:07d}"

    def text(self, token: str, low: int, high: int) -> str:
        """The token, then sentences of 8 words: the test server's extractive summary (the first sentence
        of each line) keeps the token and shrinks the rest."""
        words = [
            f"{self.rng.choice(VOCABULARY)}{self.rng.randrange(1000)}"
            for _ in range(self.rng.randrange(low, high))
        ]
        return (
            f"{token} "
            + ". ".join(" ".join(words[i : i + 8]) for i in range(0, len(words), 8))
            + "."
        )

    def loop(self, pause: float, body) -> None:
        while not self.stop.is_set():
            try:
                body()
            except Exception as exc:  # the soak's own fault: say so, and keep the actor going
                self.note(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}")
            self.stop.wait(pause)

    def episode_writer(self) -> None:
        token = self.token()
        old = self.rng.random() < 0.25
        when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
            days=self.rng.uniform(35, 45)
        )
        kind = (
            ["--kind", "old", "--created-at", when.isoformat()]
            if old
            else ["--kind", "observation"]
        )
        run = self.memctl(
            "episode",
            ["episode", "add", "-", "--source", "soak", *kind],
            input=self.text(token, 10, 600),
        )
        if run.rc == 0 and run.out.strip().isdigit():
            self.state.acked["episode"][token] = (
                "old" if old else "observation",
                int(run.out),
                run.t1 - run.t0,
            )

    def import_writer(self) -> None:
        tokens = [self.token() for _ in range(self.args.batch)]
        path = self.work / f"batch-{tokens[0]}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"content": self.text(t, 10, 200), "source": "soak-import"}) + "\n"
                for t in tokens
            )
        )
        run = self.memctl("import", ["episode", "import", str(path), "-f", "json"])
        path.unlink()
        batch = Batch(tokens, acked=run.rc == 0, killed=run.killed)
        self.state.batches.append(batch)
        if batch.acked:
            for t in tokens:
                self.state.acked["import"][t] = ("observation", None, run.t1 - run.t0)

    def fact_writer(self) -> None:
        token = self.token()
        run = self.memctl(
            "fact", ["fact", "set", f"soak.k{self.rng.randrange(40)}", token, "--source", "soak"]
        )
        if run.rc == 0:
            self.state.acked["fact"][token] = ("fact", None, run.t1 - run.t0)

    def searcher(self) -> None:
        self.memctl(
            "search", ["episode", "search", self.rng.choice(VOCABULARY), "--no-track", "-f", "json"]
        )

    def embed_worker(self, slot: str):
        return lambda: self.memctl(slot, ["embed", "--batch-size", "32", "--limit", "256"])

    def upkeep(self) -> None:
        if self.chat_model:
            self.memctl("upkeep", ["summarize", "--older-than", "1d", "-f", "json"])
        self.memctl("upkeep", ["prune", "--yes", "-f", "json"])
        if self.backup:
            target = self.work / "backups" / f"{int(time.time())}"
            self.memctl("upkeep", ["backup", "--to", str(target)])
            for old in sorted(target.parent.glob("*"))[:-2]:
                shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------ faults

    def scheduler(self, begin: float, deadline: float) -> None:
        at, n = begin + self.args.warmup, 0
        while at < deadline - self.args.margin and not self.stop.is_set():
            if self.stop.wait(max(0.0, at - time.monotonic())):
                return
            kind = self.faults[n % len(self.faults)]
            fault = Fault(kind, time.monotonic())
            detail = getattr(self, f"_{kind}")()
            fault.end = time.monotonic()
            if detail is None:
                self.note(f"fault {kind}: nothing to inject within 30 s; not counted")
            else:
                fault.detail = detail
                self.state.faults.append(fault)
                self.note(f"fault {kind} at {fault.start - begin:.0f} s: {detail}")
            at, n = at + self.args.fault_every, n + 1

    def _kill(self, actor: str, ready) -> str | None:
        """kill -9 the actor's current command once `ready(seconds it has run)` gives a reason (up to 30 s)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stop.is_set():
            with self.lock:
                proc, started = self.procs.get(actor, (None, 0.0))
            why = (
                ready(time.monotonic() - started)
                if proc is not None and proc.poll() is None
                else None
            )
            if why:
                with self.lock:
                    self.killed.add(proc.pid)
                os.kill(proc.pid, signal.SIGKILL)
                return f"{actor} pid {proc.pid} {why}"
            time.sleep(0.05)
        return None

    def _kill_embed_worker(self) -> str | None:
        # past its start-up (about 0.5 s of imports on these machines): in a batch or between two
        return self._kill(
            self.rng.choice(["embed1", "embed2"]),
            lambda ran: f"after {ran:.1f} s" if ran > 0.8 else None,
        )

    def _kill_import(self) -> str | None:
        return self._kill(
            "import",
            lambda ran: (
                "inside its transaction (its COPY in pg_stat_activity)"
                if self._copy_running()
                else None
            ),
        )

    def _copy_running(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self._url(), autocommit=True, connect_timeout=2) as conn:
                return bool(conn.execute(IMPORT_COPY).fetchone()[0])
        except psycopg.Error:
            return False

    def _url(self) -> str:
        from memctl.db import embedded

        if self.managed:
            marker = json.loads((self.home / embedded.MANAGED).read_text())
            return f"postgresql://postgres@/{embedded.DATABASE}?host={marker['socket_dir']}&port={marker['port']}"
        info = embedded.status()
        return f"postgresql://postgres@/memctl?host={info.pgdata}&port={info.port or 5432}"

    def _ollama_restart(self) -> str:
        self.ollama.down()
        self.stop.wait(self.args.hold)
        self.ollama.up()
        return f"down for {self.args.hold:g} s"

    def _kill_postmaster(self) -> str | None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                pid = int((self.home / "pgdata" / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
                return f"pid {pid}"
            except (OSError, ValueError, IndexError):
                time.sleep(0.1)
        return None

    def _kill_serve(self) -> str | None:
        """kill -9 of `db serve` and everything of its unit (its process group: the postmaster, its backends)."""
        proc = self.serve
        if proc is None or proc.poll() is not None:
            return None
        try:
            pid = int((self.home / "pgdata" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        os.killpg(proc.pid, signal.SIGKILL)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(
                    pid, signal.SIGKILL
                )  # had it left serve's group, systemd's cgroup kill would reach it
        return f"db serve pid {proc.pid} and postmaster {pid}"

    def _disk_full(self) -> str:
        free = shutil.disk_usage(self.mount).free
        fill(self.filler)
        self.stop.wait(self.args.hold)
        self.filler.unlink()
        return f"{free / 2**20:.0f} MiB filled, held {self.args.hold:g} s, freed"

    # ------------------------------------------------------------------- soak

    def run(self) -> dict:
        try:
            self.setup()
            begin = self.begin = time.monotonic()
            deadline = begin + self.args.minutes * 60
            load_before = os.getloadavg()
            actors = {
                "episode": (0.5, self.episode_writer),
                "import": (2.0, self.import_writer),
                "fact": (0.5, self.fact_writer),
                "search": (2.0, self.searcher),
                "embed1": (1.0, self.embed_worker("embed1")),
                "embed2": (1.0, self.embed_worker("embed2")),
                "upkeep": (self.args.upkeep_every, self.upkeep),
            }
            threads = [
                threading.Thread(target=self.loop, args=spec, name=name, daemon=True)
                for name, spec in actors.items()
            ]
            threads.append(
                threading.Thread(target=self.scheduler, args=(begin, deadline), daemon=True)
            )
            for t in threads:
                t.start()
            self.stop.wait(max(0.0, deadline - time.monotonic()))
            while time.monotonic() < deadline + self.args.grace and not self.recovered():
                time.sleep(1)  # the workload runs on until the last fault's recovery is seen
            self.stop.set()
            for t in threads:
                t.join(timeout=600)
            load_after = os.getloadavg()
            if self.filler.exists():
                self.filler.unlink()
            self.ollama.up()
            self.drain()
            checks = self.check()
            checks["restart_clean"] = self.restart_clean()
            return self.figures(checks, load_before, load_after, time.monotonic() - begin)
        finally:
            self.teardown()

    def recovered(self) -> bool:
        with self.lock:
            runs = list(self.state.runs)
        return all(
            recovery(f, runs, self.ollama.embed_times) is not None for f in self.state.faults
        )

    def drain(self) -> None:
        """Embed what is still queued, as the next timer runs would."""
        for _ in range(200):
            run = self.memctl("drain", ["embed", "--batch-size", "64"])
            if run.rc == 0 and self._queued() == 0:
                return
        self.note("the queue did not drain")

    def _queued(self) -> int:
        import psycopg

        with psycopg.connect(self._url(), autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM embed_queue").fetchone()[0]

    def check(self) -> dict:
        import psycopg

        with psycopg.connect(self._url(), autocommit=True) as conn:
            return consistency(conn, self.state)

    def restart_clean(self) -> bool:
        if self.managed:
            return self.restart_managed()
        log = self.home / "pgdata" / "log"
        stopped = self.memctl("final", ["db", "stop"])
        offset = log.stat().st_size
        started = self.memctl("final", ["db", "start"])
        status = self.memctl("final", ["status", "-f", "json"])
        with open(log, encoding="utf-8", errors="replace") as handle:
            handle.seek(offset)
            text = handle.read()
        clean = "database system was shut down at" in text and not re.search(
            r"not properly shut down|PANIC|FATAL|recovery", text
        )
        if not (stopped.rc == started.rc == status.rc == 0 and clean):
            self.note(
                f"restart: stop {stopped.rc}, start {started.rc}, status {status.rc}; log: {text.strip()[-500:]}"
            )
            return False
        return True

    def restart_managed(self) -> bool:
        """The unit stopped (SIGTERM: exit 0, a clean shutdown) and started again: no crash recovery."""
        stopped = self.stop_serve()
        offset = self.serve_log_size()
        self.serve_held.clear()
        started = self.wait_served(offset)
        status = self.memctl("final", ["status", "-f", "json"])
        text = self.serve_log.read_text(errors="replace")[offset:]
        clean = "database system was shut down at" in text and not re.search(
            r"not properly shut down|PANIC|recovery", text
        )
        if not (stopped == 0 and started and status.rc == 0 and clean):
            self.note(
                f"restart: serve stopped {stopped}, started {started}, status {status.rc}; "
                f"log: {text.strip()[-500:]}"
            )
            return False
        return True

    def figures(self, checks: dict, load_before, load_after, elapsed: float) -> dict:
        runs, faults = self.state.runs, self.state.faults
        for f in faults:
            f.recovery_s = recovery(f, runs, self.ollama.embed_times)
        acked = {w: len(self.state.acked[w]) for w in WRITES}
        latencies = sorted(
            v[2] for w in WRITES for v in self.state.acked[w].values() if w != "import"
        ) + sorted(r.t1 - r.t0 for r in runs if r.actor == "import" and r.rc == 0)
        by_kind = {k: sum(f.kind == k for f in faults) for k in self.faults}
        durations: dict[str, list[float]] = {}
        for r in runs:
            durations.setdefault(r.actor, []).append(r.t1 - r.t0)
        exits: dict[str, int] = {}
        said: dict[str, str] = {}  # one message per failing exit code, as the operator saw it
        for r in runs:
            key = f"{r.actor}:{'killed' if r.killed else r.rc}"
            exits[key] = exits.get(key, 0) + 1
            if r.rc not in (0, -signal.SIGKILL) and r.err.strip():
                said.setdefault(f"exit {r.rc}: {r.err.strip().splitlines()[-1][:160]}", key)
        unexpected = [
            f"{r.actor} `{r.command}` exit {r.rc} at {r.t1 - self.begin:.1f} s: "
            f"{(r.err.strip().splitlines() or [''])[-1][:240]}"
            for r in runs
            if not r.killed and not explained(r, faults) and r.actor not in ("setup", "teardown")
        ]
        tracebacks = [
            f"{r.actor} `{r.command}`: {r.err.strip()[-500:]}" for r in runs if "Traceback" in r.err
        ]
        result = {
            "minutes": self.args.minutes,
            "elapsed_s": round(elapsed, 1),
            "cores": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in load_after],
            "writes_acknowledged": sum(acked.values()),
            "acknowledged_by_kind": acked,
            "import_batches_acknowledged": sum(b.acked for b in self.state.batches),
            "writes_lost": checks["lost"],
            "faults_by_kind": by_kind,
            "p50_write_s": round(percentile(latencies, 50), 3),
            "p99_write_s": round(percentile(latencies, 99), 3),
            "recovery_s": [
                {
                    "kind": f.kind,
                    "at_s": round(f.start - self.begin, 1),
                    "recovery_s": None if f.recovery_s is None else round(f.recovery_s, 2),
                    "detail": f.detail,
                    "refused": refused(f, runs),
                }
                for f in faults
            ],
            "topology": self.args.topology,
            "serve_starts": self.serve_starts,
            "server_log": server_log(
                self.serve_log if self.managed else self.home / "pgdata" / "log"
            ),
            "exit_codes": dict(sorted(exits.items())),
            "messages": sorted(said),
            "command_s": {
                a: {"n": len(d), "p50": round(statistics.median(d), 2), "max": round(max(d), 2)}
                for a, d in sorted(durations.items())
            },
            "unexpected_exits": unexpected[:20],
            "tracebacks": len(tracebacks),
            "traceback_samples": tracebacks[:3],
            "notes": self.state.notes,
            "runs": [
                [
                    r.actor,
                    "killed" if r.killed else r.rc,
                    round(r.t0 - self.begin, 1),
                    round(r.t1 - self.begin, 1),
                    (r.err.strip().splitlines() or [""])[-1][:200],
                ]
                for r in runs
            ],
            **{k: v for k, v in checks.items() if k != "lost"},
        }
        result["unexpected_exit_count"] = len(unexpected)
        result["passed"] = (
            result["writes_lost"] == 0
            and all(by_kind.values())
            and not tracebacks
            and not unexpected
            and all(acked.values())
            and checks["duplicated"] == 0
            and checks["half_written_imports"] == 0
            and checks["orphaned_chunks"] == 0
            and checks["episodes_without_chunks"] == 0
            and checks["chunks_unsettled"] == 0
            and checks["lineage_errors"] == 0
            and checks["fact_history_errors"] == 0
            and checks["restart_clean"]
            and all(f.recovery_s is not None for f in faults)
        )
        return result


# An import's COPY of episodes, chunks or queue rows, still inside its transaction (embed workers COPY vectors).
IMPORT_COPY = """SELECT count(*) FROM pg_stat_activity WHERE application_name = 'memctl'
AND query ~ '^(/\\* memctl:writer \\*/\\s*)?COPY (episodes|chunks|embed_queue) '
AND state IN ('active', 'idle in transaction')"""
ORPHANED_CHUNKS = """SELECT count(*) FROM chunks c
WHERE NOT EXISTS (SELECT FROM episodes e WHERE e.agent = c.agent AND e.id = c.episode_id)"""
EPISODES_WITHOUT_CHUNKS = """SELECT count(*) FROM episodes e
WHERE NOT EXISTS (SELECT FROM chunks c WHERE c.agent = e.agent AND c.episode_id = e.id)"""
EPISODE_TOKENS = """SELECT m[1], count(*) FROM episodes e, regexp_matches(e.content, %s, 'g') AS m
WHERE e.kind <> 'summary' GROUP BY 1"""
FACT_TOKENS = "SELECT new_value, count(*) FROM fact_history WHERE op = 'set' AND key LIKE 'soak.k%%' GROUP BY 1"
# A fact's current row is its history's last set, and its versions run 1..n without a gap.
FACT_HISTORY_ERRORS = """SELECT count(*) FROM facts f
JOIN LATERAL (SELECT max(version) AS top, count(*) AS n, (array_agg(new_value ORDER BY version DESC))[1] AS last
              FROM fact_history h WHERE h.namespace = f.namespace AND h.key = f.key) h ON true
WHERE f.key LIKE 'soak.k%%' AND (h.top <> f.version OR h.n <> f.version OR h.last <> f.value)"""
SUMMARIZED = "SELECT DISTINCT source_id FROM summary_sources WHERE source_id = ANY(%s)"
ACTIVE_MODEL = "SELECT id, table_name FROM embedding_models WHERE state = 'active'"
CHUNK_STATES = """SELECT count(*) AS chunks, count(v.chunk_id) AS embedded,
       count(*) FILTER (WHERE v.chunk_id IS NULL AND f.error <> '') AS failed,
       count(*) FILTER (WHERE v.chunk_id IS NULL AND coalesce(f.error, '') = '') AS unsettled
FROM chunks c
LEFT JOIN {table} v ON v.agent = c.agent AND v.chunk_id = c.id
LEFT JOIN embed_failures f ON f.model_id = %s AND f.agent = c.agent AND f.chunk_id = c.id"""


def _pads() -> dict:
    """The erasure key's pads: lineage keeps each source's sha256 keyed (memctl.places.lineage_digest)."""
    from memctl import places
    from memctl.write import erased

    ipad, opad = places.pads(erased.load_key(create=False) or b"")
    return {"ipad": ipad, "opad": opad}


LINEAGE_ERRORS = """SELECT
  (SELECT count(*) FROM episodes e WHERE e.kind = 'summary'
     AND NOT EXISTS (SELECT FROM summary_sources s WHERE s.agent = e.agent AND s.summary_id = e.id))
+ (SELECT count(*) FROM summary_sources s JOIN episodes e ON e.agent = s.agent AND e.id = s.source_id
     WHERE sha256(%(opad)s || sha256(%(ipad)s || e.content_hash)) <> s.source_hash
        OR e.created_at <> s.source_created_at)
+ (SELECT count(*) FROM (SELECT FROM summary_sources GROUP BY agent, source_id HAVING count(*) > 1) twice)"""


def consistency(conn, state: State) -> dict:
    """What the database holds against what was acknowledged, and the invariants of its tables."""
    from psycopg import sql

    found = dict(conn.execute(EPISODE_TOKENS, (TOKEN,)).fetchall())
    found.update(conn.execute(FACT_TOKENS).fetchall())
    old_ids = [v[1] for v in state.acked["episode"].values() if v[0] == "old"]
    summarized = {row[0] for row in conn.execute(SUMMARIZED, (old_ids,)).fetchall()}
    lost = pruned = duplicated = 0
    for kind in WRITES:
        for token, (episode_kind, episode_id, _) in state.acked[kind].items():
            n = found.get(token, 0)
            if n == 0 and episode_kind == "old" and episode_id in summarized:
                pruned += 1  # summarized, then pruned by retention: held by its summary's lineage
            lost += n == 0 and not (episode_kind == "old" and episode_id in summarized)
            duplicated += n > 1
    acked = {t for kind in WRITES for t in state.acked[kind]}
    half = sum(0 < sum(t in found for t in b.tokens) < len(b.tokens) for b in state.batches)
    model_id, table = conn.execute(ACTIVE_MODEL).fetchone()
    chunks, embedded, failed, unsettled = conn.execute(
        sql.SQL(CHUNK_STATES).format(table=sql.Identifier(table)), (model_id,)
    ).fetchone()
    return {
        "lost": lost,
        "duplicated": duplicated,
        "pruned_after_summary": pruned,
        "unacknowledged_present": sum(1 for t in found if t.startswith("soak") and t not in acked),
        "half_written_imports": half,
        "killed_imports": sum(b.killed for b in state.batches),
        # killed between its commit and its exit (the probe races the commit): durable, never acknowledged
        "killed_imports_committed": sum(
            b.killed and all(t in found for t in b.tokens) for b in state.batches
        ),
        "orphaned_chunks": conn.execute(ORPHANED_CHUNKS).fetchone()[0],
        "episodes_without_chunks": conn.execute(EPISODES_WITHOUT_CHUNKS).fetchone()[0],
        "fact_history_errors": conn.execute(FACT_HISTORY_ERRORS).fetchone()[0],
        "chunks": chunks,
        "chunks_embedded": embedded,
        "chunks_failed": failed,
        "chunks_unsettled": unsettled,
        "failure_reasons": dict(
            conn.execute(
                "SELECT left(error, 120), count(*) FROM embed_failures GROUP BY 1 "
                "ORDER BY 2 DESC LIMIT 5"
            ).fetchall()
        ),
        "summaries": conn.execute(
            "SELECT count(*) FROM episodes WHERE kind = 'summary'"
        ).fetchone()[0],
        "lineage_errors": conn.execute(LINEAGE_ERRORS, _pads()).fetchone()[0],
        "database_mb": round(
            conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 2**20, 1
        ),
    }


def recovery(fault: Fault, runs: list[Run], embed_times: list[float]) -> float | None:
    """Seconds from the fault's end to the first success of what it broke: the killed worker's next run,
    the next import, the next write (postmaster, disk), an embedding request answered (Ollama)."""
    if fault.kind == "ollama_restart":
        after = [t for t in embed_times if t >= fault.end]
        return min(after) - fault.end if after else None
    wanted = {
        "kill_embed_worker": lambda r: r.actor == fault.detail.split()[0],
        "kill_import": lambda r: r.actor == "import",
        "ollama_restart": lambda r: r.actor in ("embed1", "embed2"),
    }.get(fault.kind, lambda r: r.actor in WRITES)
    done = [r.t1 for r in runs if r.t0 >= fault.end and r.rc == 0 and wanted(r)]
    return min(done) - fault.end if done else None


def explained(run: Run, faults: list[Fault], slack: float = 10.0) -> bool:
    """Exit 0, or an exit of EXPECTED_EXITS (3 unavailable, 5 disk full) by a command that ended during a fault
    or its recovery (plus `slack` seconds): any other exit, or one of those at a calm moment, is unexpected."""
    if run.rc == 0:
        return True
    return run.rc in EXPECTED_EXITS and any(
        f.start - 1 <= run.t1 and run.t0 <= f.end + (f.recovery_s or 0.0) + slack for f in faults
    )


def refused(fault: Fault, runs: list[Run]) -> dict[str, int]:
    """Exit codes of the commands that ended, failing, while the fault lasted or within 2 s of its end."""
    codes: dict[str, int] = {}
    for r in runs:
        if fault.start <= r.t1 <= fault.end + 2 and r.rc != 0 and not r.killed:
            codes[str(r.rc)] = codes.get(str(r.rc), 0) + 1
    return codes


def server_log(log: Path) -> dict[str, int]:
    """What the embedded server's log says happened to it."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return {
        "starts": text.count("starting PostgreSQL"),
        "panics": text.count("PANIC:"),
        "crash_recoveries": text.count("not properly shut down"),
        "no_space_errors": text.count("No space left on device"),
    }


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, int(pct) - 1))]


def fill(path: Path) -> None:
    """A file that takes every free byte of its filesystem."""
    block = b"\0" * 2**20
    with open(path, "wb", buffering=0) as handle:
        for size in (2**20, 4096):
            try:
                while True:
                    handle.write(block[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    exe = str(beside) if beside.exists() else shutil.which("memctl")
    if not exe:
        raise SystemExit("soak: no memctl beside this Python or on PATH")
    return exe


def print_figures(result: dict) -> None:
    acked = result["acknowledged_by_kind"]
    print(
        f"soak ({result['topology']}, `db serve` started {result['serve_starts']} times): {result['minutes']:g} min ({result['elapsed_s']} s with set-up and checks), "
        f"{result['cores']} cores, load {result['load_before'][0]} -> {result['load_after'][0]}"
    )
    print(
        f"writes acknowledged: {result['writes_acknowledged']} (episode add {acked['episode']}, import "
        f"{acked['import']} in {result['import_batches_acknowledged']} batches, fact set {acked['fact']})"
    )
    print(
        f"writes lost: {result['writes_lost']}   duplicated: {result['duplicated']}   half-written imports: "
        f"{result['half_written_imports']}   pruned after summary: {result['pruned_after_summary']}"
    )
    print(
        f"stored but never acknowledged: {result['unacknowledged_present']} (of {result['killed_imports']} imports "
        f"killed, {result['killed_imports_committed']} had committed before the kill)"
    )
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in result["faults_by_kind"].items()))
    print(
        f"write latency: p50 {result['p50_write_s']:.3f} s, p99 {result['p99_write_s']:.3f} s "
        "(a whole `memctl` process each)"
    )
    for f in result["recovery_s"]:
        rec = "NOT RECOVERED" if f["recovery_s"] is None else f"{f['recovery_s']:.2f} s"
        codes = ", ".join(f"exit {c} x{n}" for c, n in sorted(f["refused"].items())) or "none"
        print(
            f"  at {f['at_s']:>7.1f} s  {f['kind']:<18} recovered in {rec}  ({f['detail']}; failed meanwhile: "
            f"{codes})"
        )
    print(
        f"chunks: {result['chunks']} ({result['chunks_embedded']} embedded, {result['chunks_failed']} failed with "
        f"a reason, {result['chunks_unsettled']} neither); orphaned chunks {result['orphaned_chunks']}, "
        f"episodes without chunks {result['episodes_without_chunks']}"
    )
    print(
        "server log: "
        + ", ".join(f"{k} {v}" for k, v in result["server_log"].items())
        + f"; database {result['database_mb']} MB"
    )
    print(
        f"summaries {result['summaries']}, lineage errors {result['lineage_errors']}; tracebacks "
        f"{result['tracebacks']}; restart clean: {result['restart_clean']}"
    )
    print("exit codes: " + ", ".join(f"{k} {v}" for k, v in result["exit_codes"].items()))
    print(
        "seconds per command (n, p50, max): "
        + ", ".join(f"{a} {d['n']}/{d['p50']}/{d['max']}" for a, d in result["command_s"].items())
    )
    for line in result["messages"][:12]:
        print(f"  said: {line}")
    for line in result["unexpected_exits"]:
        print(f"  unexpected: {line}")
    print("PASSED" if result["passed"] else "FAILED")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--minutes", type=float, help="how long the workload runs (default: the profile's)"
    )
    p.add_argument(
        "--profile", choices=sorted(PROFILES), default="short", help="short: 2 min; full: 30 min"
    )
    p.add_argument(
        "--topology",
        choices=sorted(TOPOLOGY_FAULTS),
        default="standard",
        help="standard: the server a command starts; managed: `memctl db serve` under a supervisor",
    )
    p.add_argument(
        "--fault-every",
        type=float,
        help="seconds between faults (default: five per run up to 2 min, then every 45 s)",
    )
    p.add_argument(
        "--hold", type=float, default=10.0, help="seconds a full disk or a stopped Ollama lasts"
    )
    p.add_argument("--warmup", type=float, default=10.0, help="seconds before the first fault")
    p.add_argument(
        "--margin", type=float, default=25.0, help="no fault starts in the last MARGIN seconds"
    )
    p.add_argument(
        "--grace",
        type=float,
        default=180.0,
        help="seconds the workload may run past the end while the last fault has not recovered",
    )
    p.add_argument(
        "--upkeep-every", type=float, default=20.0, help="seconds between summarize/prune/backup"
    )
    p.add_argument("--batch", type=int, default=150, help="episodes per import")
    p.add_argument(
        "--disk-mb",
        type=int,
        help="size of the data filesystem (default 512 + 64 per minute: the "
        "writes fill it only when a fault does)",
    )
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, config)")
    args = p.parse_args()
    args.minutes = args.minutes if args.minutes is not None else PROFILES[args.profile]
    if args.fault_every is None:
        span = args.minutes * 60 - args.warmup - args.margin
        args.fault_every = max(10.0, min(45.0, span / len(TOPOLOGY_FAULTS[args.topology])))
    args.disk_mb = args.disk_mb or int(512 + 64 * args.minutes)
    if os.geteuid() != 0:
        print(
            "soak: needs root (it mounts a size-limited filesystem for the data directory)",
            file=sys.stderr,
        )
        return 2
    result = Soak(args).run()
    print_figures(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
