"""Every write path x every erasure x every copy (issue 49), generated from one declaration: a unique marker written
through each path, erased by each erasure that reaches what the path wrote, is in no place of the catalog
afterwards (tests/fix_places.py: every column of every table read as text), no plain sha256 of its text is stored,
and `erasure verify` agrees: live, after an export taken before the erasure is imported again, and after a backup
taken before it is restored.

One database per erasure holds every path's marker (each path its own source), so each copy is made, imported
and restored once for all of them: WRITES, ERASURES and COPIES below are the whole declaration.
"""

from __future__ import annotations

import datetime
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memctl.write.values import WRITER

CONFIG = """[retention]
raw = "30d"
note = "1d"
runbook = "1d"

[summarize]
model = "llama3.2:3b"
kinds = ["raw"]

[backup]
dir = "{backups}"
"""
OLD = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=40)).replace(
    hour=9, minute=0, second=0, microsecond=0
)


@dataclass
class World:
    """One database, the CLI on it, and what each path wrote: path -> (source, marker, full texts)."""

    cli: object
    conn: object
    db_url: str
    tmp: Path
    written: dict[str, tuple[str, str, list[str]]] = field(default_factory=dict)

    def run(self, *args: str, input: str | None = None, code: int = 0):
        out = self.cli(*args, input=input)
        assert out.exit_code == code, (args, out.stderr)
        return out


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# --- the write paths: each stores TEXT (holding its marker) from SOURCE -------------------------------------


def _episode_add(w: World, source: str, text: str) -> None:
    w.run("episode", "add", text, "--source", source, "--kind", "note")


def _episode_import(w: World, source: str, text: str) -> None:
    w.run(
        "episode",
        "import",
        "-",
        input=_lines([{"content": text, "source": source, "kind": "note"}]),
    )


def _import(w: World, source: str, text: str) -> None:
    header = json.loads(w.run("export").stdout.splitlines()[0])
    record = {
        "type": "episode",
        "id": 900001,
        "agent": "default",
        "kind": "note",
        "source": source,
        "importance": 5,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "meta": {},
        "content": text,
    }
    w.run("import", "-", input=_lines([header, record]))


def _ingest(w: World, source: str, text: str) -> None:
    log = w.tmp / f"{source}.log"
    log.write_text(text + "\n")
    w.run("ingest", str(log), "--source", source, "--kind", "note")


def _mcp_remember(w: World, source: str, text: str) -> None:
    from memctl import config, db
    from memctl.mcp import sessions, tools

    session = sessions.Session(
        config.load(), sessions.Scope.make(source=source), lambda: db.connect(w.db_url)
    )
    assert tools.remember(session, text, kind="note").data["stored"]


def _fact_set(w: World, source: str, text: str) -> None:
    w.run("fact", "set", f"fact.{source}", text, "--source", source)


def _runbook_run(w: World, source: str, text: str) -> None:
    import git

    repo = w.tmp / "books"
    made = git.Repo.init(repo)
    with made.config_writer() as config:
        config.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    (repo / "mark.md").write_text(
        f"# Mark\n\nFails after saying it.\n\n## 1. Say\n\n```sh\necho '{text}'\nexit 3\n```\n"
    )
    made.index.add(["mark.md"])
    made.index.commit("add")
    w.run(
        "runbook", "run", "mark", "--repo", str(repo), "--yes", code=1
    )  # failed: the record quotes the output


def _summarize(w: World, source: str, text: str) -> None:
    rows = [
        {
            "content": c,
            "kind": "raw",
            "source": source,
            "created_at": (OLD + datetime.timedelta(minutes=i)).isoformat(),
        }
        for i, c in enumerate([text, "Disk on web-3 reached 91% at noon. Logs were rotated."])
    ]
    w.run("episode", "import", "-", input=_lines(rows))
    assert len(w.run("summarize", "-f", "json").json()) == 1


# path: (what it writes, how, the source it writes as)
WRITES = {
    "episode add": ("episode", _episode_add, "w-add"),
    "episode import": ("episode", _episode_import, "w-eimport"),
    "import": ("episode", _import, "w-import"),
    "ingest": ("episode", _ingest, "w-ingest"),
    "mcp remember": ("episode", _mcp_remember, "w-mcp"),
    "fact set": ("fact", _fact_set, "w-fact"),
    "runbook run": ("episode", _runbook_run, "runbook:mark"),
    "summarize": ("episode", _summarize, "w-summarize"),
}


# --- the erasures: each applied to every path whose writes it reaches -------------------------------------


def _episode_delete(w: World, paths: list[str]) -> None:
    ids = [
        str(r["id"])
        for path in paths
        for r in w.conn.execute(
            "SELECT id FROM episodes WHERE kind <> 'summary' AND strpos(content, %s) > 0",
            (w.written[path][1],),
        )
    ]
    w.run("episode", "delete", *ids)


def _purge(w: World, paths: list[str]) -> None:
    for path in paths:
        w.run("purge", "--source", w.written[path][0], "--yes")


def _fact_erase(w: World, paths: list[str]) -> None:
    for path in paths:
        w.run("fact", "delete", f"fact.{w.written[path][0]}", "--erase")


def _retention(w: World, paths: list[str]) -> None:
    """A blocked source's episodes past their kind's age, pruned (the ledger's prune_blocked)."""
    sources = [w.written[path][0] for path in paths]
    for source in sources:
        w.run("source", "block", source)
    w.conn.execute(
        WRITER + "UPDATE episodes SET created_at = created_at - interval '10 days' "
        "WHERE source = ANY(%s) AND kind <> 'raw'",
        (sources,),
    )  # test data: past their age
    w.run("prune", "--yes")


ERASURES = {
    "episode delete": ("episode", _episode_delete),
    "purge": ("episode", _purge),
    "fact erase": ("fact", _fact_erase),
    "retention": ("episode", _retention),
}
COPIES = ("live", "export imported after", "backup restored after")


def _absent(w: World, places_of, copy: str) -> None:
    for path, (_, mark, texts) in w.written.items():
        assert places_of(w.conn).holding(mark) == [], (copy, path)
        assert places_of(w.conn).plain_digests(*texts) == [], (copy, path)
    verified = w.cli("erasure", "verify")
    assert verified.exit_code == 0, (copy, verified.stdout, verified.stderr)


@pytest.mark.writer_check_off  # a restore into the database its dump came from (tests/conftest.py)
@pytest.mark.parametrize("erasure", list(ERASURES))
def test_an_erasure_reaches_every_copy_of_every_path(
    erasure, cli, conn, db_url, ollama_env, ollama, places_of, tmp_path
):
    kind, erase = ERASURES[erasure]
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG.format(backups=tmp_path / "backups"))
    w = World(cli, conn, db_url, tmp_path)
    paths = [path for path, (wrote, _, _) in WRITES.items() if wrote == kind]
    for path in paths:
        _, write, source = WRITES[path]
        mark = f"zq{uuid.uuid4().hex}"
        text = f"the {path} said {mark} once"
        write(w, source, text)
        assert places_of(conn).holding(mark), path  # the test sees each before
        w.written[path] = (source, mark, [text])
    w.run("embed")
    export = tmp_path / "before.jsonl"
    w.run("export", "--out", str(export))
    backup = w.run("backup", "-f", "json").json()["file"]

    erase(w, paths)
    _absent(w, places_of, COPIES[0])

    imported = w.run("import", str(export), "-f", "json")
    assert imported.json()[0]["erased"] >= len(paths) and "left out" in imported.stderr
    _absent(w, places_of, COPIES[1])

    restored = w.run("restore", backup, "--yes", "-f", "json")
    assert restored.json()["erasures_reapplied"]
    _absent(w, places_of, COPIES[2])
