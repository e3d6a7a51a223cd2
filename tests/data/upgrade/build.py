"""Build the upgrade fixtures: a memory made by memctl at each schema state main has had (tests/data/upgrade/).

For each commit of COMMITS it checks the commit out into a temporary worktree (outside this checkout), runs that
commit's own command line (`python -m memctl`, the worktree first on sys.path, in a venv holding today's
dependencies and no memctl) against a database of a scratch embedded PostgreSQL and this checkout's
Ollama-protocol test server (two small deterministic models, MODELS), writes what that commit's command line can
write (its --help is read for each command and option first), records what its searches find, and dumps the
database (pg_dump's custom format, compressed, owners and grants left out) with a JSON of what it did:

    COMMIT.dump   the database
    COMMIT.json   the commit, the features it had, the rows it wrote, its searches' results

tests/test_upgrade_fixtures.py restores each into a fresh database, migrates it with today's code and checks that
nothing was lost. Run once, from the checkout, with the local environment's Python (it starts the embedded server
and imports the test server):

    .venv/bin/python tests/data/upgrade/build.py [--only COMMIT ...] [--python PY]

Commits: every commit of `git log -- sql/` that added or changed a sql file, merges with changes from their first
parent included; one per schema state (the same sql/ tree is one state). Kept: every state of main's first-parent
history, and the states of branch commits whose file contents main never had (the edited migrations' earlier
contents: 0019 twice, 0022 once; 0002's earlier content is main's own). Left out: branch states made only of files
main had in the same content (de7de6f, 5a2437f, 479d192, 13d2685 and the merges of main into branches), which
are main's states with some files missing: docs/releases.md lists them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]
sys.path.insert(0, str(CHECKOUT))

# (commit, what its schema state is): in history's order.
COMMITS = [
    ("c7e1950", "0001, 0002 as first written: facts only"),
    (
        "17705b6",
        "0003, 0004: episodes, embeddings, blocked sources, runbooks; 0002 as first written",
    ),
    ("4f2d558", "0002 edited: full text per episode; the vector template's content_hash"),
    ("a04adc9", "0007: access records"),
    ("dafc392", "0008: the job log's time index"),
    ("8bac5e3", "0011: summaries and lineage"),
    ("1891a38", "0012, 0014: facts in two timelines, repeats"),
    ("df2c7dc", "0013: words inside paths"),
    ("42b667c", "0015: last seen"),
    ("468f7ce", "0018: model instructions"),
    ("df4f8cc", "branch i39-agents: 0019 as first written"),
    ("8c4fc07", "branch i39-agents: 0019's second content"),
    ("55c0fa2", "merge of i41-erasure: 0020, the erasure ledger"),
    ("5a71a1e", "merge of i37-admission: 0017, the fold key"),
    ("23b13d6", "merge of i40-shell: 0021, record keys and ingest cursors"),
    ("6b58d10", "merge of i39-agents: 0019 as released"),
    ("b86766e", "branch i39-speed: 0022 as first written"),
    ("3ef5ae8", "merge of i39-speed: 0022 as released (main's schema before 0.2.0)"),
]
MODELS = {"fixture-a": 16, "fixture-b": 12}  # name -> dims; HashEmbedder vectors keyed by the name
CHAT = "llama3.2:3b"  # the test server's extractive stand-in
KINDS = ["observation", "incident", "conversation"]  # summarized
DAY = "2026-11-20T0{}:00:00Z"
EPISODES = [  # (agent, kind, source, importance, text)
    (
        "ops-bot",
        "observation",
        "monitor",
        6,
        "Disk usage on db-1 reached 91% at 03:10; the WAL archive had grown.",
    ),
    (
        "ops-bot",
        "incident",
        "pager",
        9,
        "Deploy of api v2.3 failed at 03:12: /var was full; rotating nginx logs "
        "freed 4 GB and the deploy went through.",
    ),
    (
        "ops-bot",
        "observation",
        "monitor",
        4,
        "Redis evicted keys under memory pressure; raising maxmemory to 2gb stopped the evictions.",
    ),
    (
        "chat-bot",
        "conversation",
        "chat",
        5,
        "The user prefers answers in French and asked about the backup "
        "schedule for the reporting database.",
    ),
    (
        "chat-bot",
        "conversation",
        "chat",
        3,
        "We agreed the staging cluster is rebuilt every Sunday night.",
    ),
    (
        "deploy-bot",
        "observation",
        "ci",
        5,
        "Pipeline 4411 built image registry.local/api:2.3.1 in 7 minutes.",
    ),
    (
        "deploy-bot",
        "incident",
        "ci",
        8,
        "Certificate for api.example.org expires on 2026-12-24; renewal job "
        "failed with an ACME rate limit.",
    ),
]
LONG = "Postmortem of the November outage. " + " ".join(
    f"Step {n}: the on-call engineer checked replication lag on replica-{n % 3}, found it at {n * 7} seconds, "
    f"restarted the WAL receiver and watched the lag fall."
    for n in range(1, 40)
)
REPEAT = (
    "ops-bot",
    "observation",
    "monitor",
    4,
    "Health check of lb-2 timed out once and recovered.",
)
QUERIES = [
    "why did the deploy fail",
    "redis evictions memory",
    "certificate renewal",
    "replication lag replica",
]
RUNBOOK = """# Rotate logs

Frees space on /var.

## 1. Show the space

```sh
echo space
```

## 2. Rotate

```sh
echo rotated
```
"""


class Old:
    """One commit's command line against one database."""

    def __init__(self, python: str, tree: Path, env: dict[str, str]):
        self.python, self.tree, self.env = python, tree, env
        self.helps: dict[tuple[str, ...], subprocess.CompletedProcess] = {}
        self.log: list[dict] = []

    def help(self, *words: str) -> str:
        return self._help(words).stdout

    def _help(self, words: tuple[str, ...]) -> subprocess.CompletedProcess:
        if words not in self.helps:
            self.helps[words] = self.run(*words, "--help", check=False)
        return self.helps[words]

    def has(self, *words: str) -> bool:
        """Whether the command exists: a noun whose help loads (each noun's module is loaded alone, and some
        commits could not load every one), or a subcommand listed in its noun's help."""
        if len(words) == 1:
            return self._help(words).returncode == 0
        listed = (
            line.strip().strip("│").strip().split(" ")[0]
            for line in self.help(*words[:-1]).splitlines()
        )
        return words[-1] in listed

    def takes(self, words: tuple[str, ...], option: str) -> bool:
        return option in self.help(*words)

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [self.python, "-m", "memctl", *args],
            cwd=self.tree,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if "--help" not in args:
            self.log.append({"args": list(args), "exit": proc.returncode})
        if check and proc.returncode != 0:
            raise SystemExit(
                f"{self.tree.name}: memctl {' '.join(args)} exited {proc.returncode}: {proc.stderr[-800:]}"
            )
        return proc

    def cmd(
        self, words: tuple[str, ...], *args: str, options: dict | None = None, check: bool = True
    ):
        """Run WORDS ARGS with each of OPTIONS this commit's command takes."""
        given = []
        for option, value in (options or {}).items():
            if self.takes(words, option):
                given += [option] if value is True else [option, str(value)]
        return self.run(*words, *args, *given, check=check)


def scenario(old: Old, home: Path) -> dict:
    """Everything this commit's command line can write, through it."""
    features = []
    old.run("db", "migrate")
    fact = ("fact", "set")
    old.cmd(fact, "db.host", "10.0.0.1", options={"--source": "fixture"})
    old.cmd(fact, "db.host", "10.0.0.2", options={"--source": "fixture"})
    old.cmd(fact, "db.port", "5432", options={"--namespace": "ops", "--source": "fixture"})
    old.cmd(
        fact,
        "db.host",
        "10.0.0.3",
        options={"--source": "fixture", "--valid-from": "2026-11-01T00:00:00Z"},
    )
    if old.has("fact", "delete"):
        features.append("fact delete")
        old.cmd(fact, "old.key", "gone")
        old.run("fact", "delete", "old.key")
        if old.takes(("fact", "delete"), "--erase"):
            features.append("fact erase")
            old.cmd(fact, "token.note", "a note to erase")
            old.run("fact", "delete", "token.note", "--erase")
    if not old.has("episode"):
        return {"features": features}
    features.append("episodes")
    add = ("episode", "add")
    ids = []
    for n, (agent, kind, source, importance, text) in enumerate(EPISODES + [REPEAT, REPEAT]):
        out = old.cmd(
            add,
            text,
            options={
                "--agent": agent,
                "--kind": kind,
                "--source": source,
                "--importance": importance,
                "--created-at": DAY.format(n % 10),
                "--meta": json.dumps({"n": n}),
            },
        )
        ids.append(out.stdout.strip().splitlines()[-1])
    old.cmd(add, LONG, options={"--agent": "ops-bot", "--kind": "postmortem", "--source": "wiki"})
    if old.has("source"):
        features.append("blocked sources")
        old.cmd(("source", "block"), "spam-bot", options={"--reason": "noise"})
        old.cmd(add, "buy cheap watches", options={"--source": "spam-bot"}, check=False)  # refused
    if old.has("purge"):
        features.append("purge")
        old.cmd(add, "a line to be purged", options={"--source": "purged-src"})
        old.run("purge", "--source", "purged-src", "--yes")
    if old.has("episode", "delete"):
        features.append("episode delete")
        gone = (
            old.cmd(add, "an episode deleted by id", options={"--source": "chat"})
            .stdout.strip()
            .splitlines()[-1]
        )
        old.run("episode", "delete", gone)
    if old.has("embed"):
        features.append("embed")
        old.run("embed")
    if old.has("reembed"):
        features.append("second model")
        old.cmd(("reembed", "start"), options={"--model": "fixture-b", "--embedder": "ollama"})
        old.run("reembed", "run")
        old.run("embed")
    if old.has("summarize"):
        features.append("summaries")
        Path(old.env["MEMCTL_CONFIG"]).write_text(
            f'[summarize]\nmodel = "{CHAT}"\nkinds = {json.dumps(KINDS)}\n'
        )
        old.cmd(("summarize",), options={"--older-than": "1d"})
    if old.has("runbook"):
        features.append("runbook runs")
        old.cmd(("runbook", "run"), "rotate-logs", options={"--yes": True, "--agent": "ops-bot"})
    if old.has("agent"):
        features.append("agents")
        old.cmd(("agent", "add"), "fx-bot", options={"--namespace": "bots"})
        old.run("agent", "token", "fx-bot")
    if old.has("ingest"):
        features.append("ingest")
        log = home / "app.log"
        log.write_text(
            "".join(
                f"2026-11-2{n}T10:00:00Z app[1]: request {n} served in {n * 10} ms\n"
                for n in range(5)
            )
        )
        old.cmd(
            ("ingest",),
            str(log),
            options={
                "--format": "lines",
                "--source": "app-log",
                "--cursor-file": str(home / "app.cursor"),
            },
        )
    if old.has("embed"):  # the queue drained: a migration must not fill it again
        old.run("embed")
    if old.has("reembed"):
        old.run("reembed", "run")
    searches = []
    modes = (
        ["hybrid", "vector", "text"] if old.takes(("episode", "search"), "--mode") else ["hybrid"]
    )
    for query in QUERIES:
        for mode in modes:
            out = old.cmd(
                ("episode", "search"),
                query,
                options={"--mode": mode, "-k": 3, "--format": "json"},
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip():
                searches.append(
                    {"query": query, "mode": mode, "ids": [r["id"] for r in json.loads(out.stdout)]}
                )
    return {"features": features, "searches": searches}


def build(commit: str, why: str, python: str, server_url: str, ollama_url: str, work: Path) -> None:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from memctl.db import embedded

    tree = work / commit
    subprocess.run(
        ["git", "-C", str(CHECKOUT), "worktree", "add", "--detach", "--force", str(tree), commit],
        check=True,
        capture_output=True,
    )
    try:
        name = f"fixture_{commit}"
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = make_conninfo(server_url, dbname=name)
        home = work / f"home-{commit}"
        home.mkdir()
        runbooks = home / "runbooks"
        runbooks.mkdir()
        (runbooks / "rotate-logs.md").write_text(RUNBOOK)
        for git in (
            ["init", "-q"],
            ["add", "."],
            ["-c", "user.name=f", "-c", "user.email=f@f", "commit", "-qm", "r"],
        ):
            subprocess.run(["git", "-C", str(runbooks), *git], check=True)
        config = home / "config.toml"
        config.touch()
        state = (
            work / f"state-{commit}"
        )  # MEMCTL_HOME: not under HOME (as root memctl refuses that)
        state.mkdir()
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "MEMCTL_HOME": str(state),
            "MEMCTL_CONFIG": str(config),
            "MEMCTL_DATABASE_URL": url,
            "MEMCTL_EMBEDDER": "ollama",
            "MEMCTL_EMBED_MODEL": "fixture-a",
            "MEMCTL_RUNBOOKS": str(runbooks),
            "OLLAMA_HOST": ollama_url,
            "PYTHONPATH": str(tree),
            "TZ": "UTC",
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }
        old = Old(python, tree, env)
        done = scenario(old, home)
        with psycopg.connect(url) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' "
                    "ORDER BY 1"
                ).fetchall()
            ]
            rows = {
                t: conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))
                ).fetchone()[0]
                for t in tables
            }
        dump = HERE / f"{commit}.dump"
        subprocess.run(
            [
                str(embedded.bin_dir() / "pg_dump"),
                "-Fc",
                "-Z9",
                "-O",
                "-x",
                "-n",
                "public",
                "-f",
                str(dump),
                "-d",
                url,
            ],
            check=True,
        )
        subject = subprocess.run(
            ["git", "-C", str(CHECKOUT), "log", "-1", "--format=%H%n%ad%n%s", "--date=iso", commit],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        files = sorted(p.name for p in (tree / "sql").glob("*.sql"))
        record = {
            "commit": subject[0],
            "date": subject[1],
            "subject": subject[2],
            "why": why,
            "sql": files,
            "models": MODELS,
            **done,
            "rows": rows,
            "commands": old.log,
        }
        (HERE / f"{commit}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(
            f"{commit}: {sum(rows.values())} rows in {len(rows)} tables, {dump.stat().st_size} bytes, "
            f"features: {', '.join(done['features']) or 'facts'}",
            flush=True,
        )
    finally:
        subprocess.run(
            ["git", "-C", str(CHECKOUT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )


def hash_model(name: str, dims: int):
    """A fixture model's vectors: today's HashEmbedder keyed by the model's name (the test computes the same)."""
    from memctl.embedding.embedders import HashEmbedder

    embedder = HashEmbedder(name, dims)
    return lambda texts: embedder.embed(texts).vectors


def deps_venv(work: Path) -> str:
    """A venv with today's dependencies and no memctl (each commit's own comes from its worktree)."""
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "-q"]
    subprocess.run(
        [*pip, "install", str(CHECKOUT), "numpy"], check=True
    )  # numpy: pgvector's arrays, which old embed used
    subprocess.run([*pip, "uninstall", "-y", "memctl"], check=True)
    return str(venv / "bin" / "python")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="build these commits only")
    parser.add_argument(
        "--python", help="a Python with memctl's dependencies and no memctl (else one is made)"
    )
    args = parser.parse_args()
    from memctl.db import embedded
    from tests.ollama_server import ModelSpec, OllamaTestServer

    work = Path(tempfile.mkdtemp(prefix="memctl-fixtures-"))
    os.environ["MEMCTL_HOME"] = str(work / "server")
    try:
        python = args.python or deps_venv(work)
        server = embedded.start()
        admin = server.url.replace(f"/{embedded.DATABASE}?", "/postgres?")
        models = {
            name: ModelSpec(dims, 512, hash_model(name, dims)) for name, dims in MODELS.items()
        }
        with OllamaTestServer(models) as ollama:
            for commit, why in COMMITS:
                if not args.only or commit in args.only:
                    build(commit, why, python, admin, ollama.url, work)
    finally:
        embedded.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
