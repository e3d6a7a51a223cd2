"""`memctl mcp` through a real client: the SDK's stdio client spawns the installed `memctl mcp`.

Every test starts the installed binary (beside this Python, as in tests/test_production.py)
with the test's database and config in its environment, talks to it through
mcp.ClientSession, and reads its stderr afterwards: memctl's own lines only, never a
traceback, never a secret. Data of other agents is seeded through the library on the
test's own connection, and what reached the database is read there too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memctl import config
from memctl.mcp import tools as catalogue
from memctl.records import episodes, facts
from memctl.write import gate, values
from tests.fix_mcp import URL_PASSWORD, run, serving, stderr_of, text
from tests.installed import memctl_exe

TOOLS = set(catalogue.TOOLS)  # the one list of tools (test_the_tool_list_is_stated_once)
WRITE_TOOLS = {name for name, (_, writes) in catalogue.TOOLS.items() if writes}
# Built at run time, so no scanner mistakes this file for a leak; a shape memctl redacts (URL_PASSWORD too).
GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0" + "K1l2M3n4O5p6Q7r8"


def seed(conn, content: str, agent: str, **fields) -> int:
    return episodes.add(conn.use_settings(config.load()), content, agent=agent, **fields)


def embed(memctl_bin) -> None:
    outcome = memctl_bin("embed")
    assert outcome.exit_code == 0, outcome.stderr


# ------------------------------------------------------------ the tools


def test_lists_the_tools_and_calls_each(conn, memctl_bin, ollama_env, log, tmp_path):
    from tests.runbook_repos import make_repo, md

    books = tmp_path / "books"
    make_repo(
        books,
        {
            "rotate-logs.md": md(
                "Rotate nginx logs",
                [("Rotate", "logrotate -f /etc/logrotate.conf")],
                "Frees disk when /var fills up.",
            )
        },
    )

    async def scenario():
        async with serving(log, "--agent", "deploy-bot", env={"MEMCTL_RUNBOOKS": str(books)}) as s:
            tools = (await s.session.list_tools()).tools
            assert {t.name for t in tools} == TOOLS
            for tool in tools:
                assert tool.description and tool.input_schema["type"] == "object", tool.name
            by_name = {t.name: t for t in tools}
            assert by_name["search"].output_schema["properties"]["results"]
            assert by_name["search"].annotations.read_only_hint is True
            assert by_name["remember"].annotations.read_only_hint is False

            stored = await s.ok(
                "remember",
                content="Deploy of api v2.3 failed at 03:10: /var was full; rotating "
                "nginx logs freed 4 GB",
                kind="conversation",
            )
            assert (
                stored["stored"] is True
                and stored["agent"] == "deploy-bot"
                and stored["importance"] == 8
            )
            found = await s.ok(
                "search", query="nginx logs disk"
            )  # by words at once, before any embedding
            assert [r["id"] for r in found["results"]] == [stored["id"]]
            assert found["results"][0]["source"] == "mcp:deploy-bot"

            embed(memctl_bin)
            hybrid = await s.call("search", query="why did the release break?", k=3)
            assert not hybrid.is_error and hybrid.structured_content["mode"] == "hybrid"
            assert not hybrid.structured_content["degraded"]
            assert stored["id"] in [r["id"] for r in hybrid.structured_content["results"]]
            assert "rotating nginx logs" in text(hybrid)

            assert (await s.ok("fact_set", key="db.host", value="10.8.0.4"))["version"] == 1
            await s.ok("fact_set", key="db.host", value="10.8.0.9")
            got = await s.call("fact_get", key="db.host")
            assert text(got) == "10.8.0.9" and got.structured_content["namespace"] == "deploy-bot"
            listed = await s.ok("fact_list", prefix="db.")
            assert [f["key"] for f in listed["facts"]] == ["db.host"]
            history = await s.ok("fact_history", key="db.host")
            assert [h["new_value"] for h in history["history"]] == ["10.8.0.4", "10.8.0.9"]

            recalled = await s.call(
                "recall", observation="nginx logs filled the disk again, db.host ok?"
            )
            block = text(recalled)
            assert block.startswith("Relevant memory") and "db.host = 10.8.0.9" in block
            assert "rotating nginx logs" in block and "rotate-logs" in block
            assert recalled.structured_content["text"] == block

            shown = await s.call("episode_get", id=stored["id"])
            assert "api v2.3" in text(shown) and shown.structured_content["agent"] == "deploy-bot"

            books_listed = await s.ok("runbook_list")
            assert [b["name"] for b in books_listed["runbooks"]] == ["rotate-logs"]
            book = await s.call("runbook_show", name="rotate-logs")
            assert "logrotate -f" in text(book) and book.structured_content["commit"]

    run(scenario)
    err = stderr_of(log)
    assert "agent 'deploy-bot'" in err
    row = conn.execute("SELECT agent, source, kind FROM episodes").fetchone()
    assert row == {"agent": "deploy-bot", "source": "mcp:deploy-bot", "kind": "conversation"}
    assert facts.get_fact(conn, "db.host", namespace="deploy-bot").source == "mcp:deploy-bot"


def test_the_tool_list_is_stated_once():
    """memctl.mcp.tools.TOOLS is the list of tools: the protocol's declarations follow it, and the two texts
    that cannot import it, `memctl mcp --help` and docs/mcp.md, are held to it here."""
    import re

    from memctl.cli import mcp as cli_mcp
    from memctl.mcp import protocol

    assert [d.__name__ for d in protocol.DECLARED] == list(catalogue.TOOLS)
    assert WRITE_TOOLS == {
        "remember",
        "fact_set",
    }  # the tools --read-only leaves out, as its help says
    listed = re.search(r"Tools: (.*?)\. ", " ".join(cli_mcp.mcp.__doc__.split())).group(1)
    assert listed.split(", ") == list(catalogue.TOOLS)
    page = (Path(__file__).resolve().parents[1] / "docs" / "mcp.md").read_text()
    rows = [line.split("|")[1] for line in page.splitlines() if line.startswith("| `")]
    assert sorted(name for row in rows for name in re.findall(r"`(\w+)`", row)) == sorted(
        catalogue.TOOLS
    )


def test_importance_zero_is_not_stored_and_says_so(conn, memctl_env, log):
    async def scenario():
        async with serving(log, "--agent", "a") as s:
            dropped = await s.ok("remember", content="sat idle for an hour", kind="stay")
            assert (
                dropped["stored"] is False
                and dropped["id"] is None
                and "importance 0" in dropped["reason"]
            )

    run(scenario)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 0


# ------------------------------------------------------------ scope


def test_an_agent_cannot_see_another_agents_memory_by_any_tool(conn, memctl_bin, ollama_env, log):
    theirs = seed(
        conn, "zebrafish pipeline for agent b: the quokka cluster password rotation", agent="b"
    )
    facts.set_fact(conn, "quokka.host", "10.9.9.9", namespace="b")
    facts.set_fact(conn, "shared.dns", "10.0.0.53", namespace="infra")
    mine = seed(conn, "agent a watched the llama cluster", agent="a")
    embed(memctl_bin)

    async def scenario():
        async with serving(log, "--agent", "a", "--shared-namespace", "infra") as s:
            for mode in ("hybrid", "text", "vector"):
                found = await s.ok(
                    "search", query="zebrafish quokka cluster password rotation", k=20, mode=mode
                )
                assert theirs not in [r["id"] for r in found["results"]], mode
                assert {r["agent"] for r in found["results"]} <= {"a"}, mode
            recalled = await s.ok(
                "recall", observation="zebrafish quokka cluster password rotation quokka.host"
            )
            assert "zebrafish" not in recalled["text"] and "10.9.9.9" not in recalled["text"]
            assert all(i.get("agent", "a") == "a" for i in recalled["items"])

            missing = await s.error("episode_get", id=theirs)
            assert (
                missing == f"no episode {theirs}"
            )  # the same answer as for an id that does not exist
            assert await s.error("episode_get", id=theirs + 1000) == f"no episode {theirs + 1000}"
            assert (await s.ok("episode_get", id=mine))[
                "content"
            ] == "agent a watched the llama cluster"

            assert "no fact 'quokka.host' in namespace 'a'" in await s.error(
                "fact_get", key="quokka.host"
            )
            for tool in ("fact_get", "fact_history"):
                assert "not readable" in await s.error(tool, key="quokka.host", namespace="b")
            assert "not readable" in await s.error("fact_list", namespace="b")
            assert "not writable" in await s.error(
                "fact_set", key="quokka.host", value="x", namespace="b"
            )
            assert "does not take agent" in await s.error("search", query="zebrafish", agent="b")
            assert "does not take agent" in await s.error("remember", content="x", agent="b")

            assert (
                await s.call("fact_get", key="shared.dns", namespace="infra")
            ).structured_content["value"] == "10.0.0.53"
            assert "not writable" in await s.error(
                "fact_set", key="shared.dns", value="evil", namespace="infra"
            )
            await s.ok("fact_set", key="own.key", value="mine")

    run(scenario)
    assert "agent 'a'" in stderr_of(log)
    assert facts.get_fact(conn, "quokka.host", namespace="b").value == "10.9.9.9"
    assert facts.get_fact(conn, "shared.dns", namespace="infra").value == "10.0.0.53"
    assert facts.get_fact(conn, "own.key", namespace="a").value == "mine"
    # nothing the server did touched b's episode, not even its access count
    assert (
        conn.execute("SELECT count(*) AS n FROM episode_access WHERE agent = 'b'").fetchone()["n"]
        == 0
    )


def test_without_agent_the_operators_view_is_said_at_start(conn, memctl_env, log):
    seed(conn, "walrus incident for agent b", agent="b")
    seed(conn, "walrus incident for agent a", agent="a")

    async def scenario():
        async with serving(log) as s:
            found = await s.ok("search", query="walrus incident", k=10)
            assert {r["agent"] for r in found["results"]} == {"a", "b"}
            stored = await s.ok("remember", content="operator note on the walrus incident")
            assert stored["agent"] == gate.DEFAULT_AGENT and stored["source"] == "mcp"

    run(scenario)
    assert "operator's view" in stderr_of(log)


def test_read_only_offers_no_write_tool(conn, memctl_env, log):
    seed(conn, "the heron queue backed up", agent="a")

    async def scenario():
        async with serving(log, "--agent", "a", "--read-only") as s:
            assert await s.tool_names() == TOOLS - WRITE_TOOLS
            assert "Unknown tool" in await s.error("remember", content="should not be stored")
            assert "Unknown tool" in await s.error("fact_set", key="k", value="v")
            assert len((await s.ok("search", query="heron queue"))["results"]) == 1

    run(scenario)
    assert "read-only" in stderr_of(log)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 1
    assert conn.execute("SELECT count(*) AS n FROM facts").fetchone()["n"] == 0
    assert conn.execute("SELECT count(*) AS n FROM episode_access").fetchone()["n"] == 0


# ------------------------------------------------------------ bad arguments


def test_bad_arguments_are_tool_errors_and_the_server_goes_on(conn, memctl_env, log):
    async def scenario():
        async with serving(log, "--agent", "a") as s:
            assert "query" in await s.error("search")  # a required argument missing
            assert "valid integer" in await s.error("search", query="x", k="many")
            assert "less than or equal to 50" in await s.error("search", query="x", k=51)
            assert "valid string" in await s.error("remember", content=123)
            assert "less than or equal to 10" in await s.error(
                "remember", content="x", importance=11
            )
            assert "'hybrid', 'vector' or 'text'" in await s.error(
                "search", query="x", mode="fuzzy"
            )
            assert "[limits] episode_bytes" in await s.error("remember", content="x" * 2_000_000)
            assert "NUL" in await s.error("remember", content="before\x00after")
            assert "NUL" in await s.error("search", query="a\x00b")
            assert "NUL" in await s.error("fact_set", key="k\x00", value="v")
            assert "NUL" in await s.error("fact_get", key="k\x00")
            assert "since" in await s.error("search", query="x", since="last tuesday")
            assert "until" in await s.error("search", query="x", until="soon")
            assert "Unknown tool" in await s.error("purge", source="mcp:a")
            assert "no runbook repository configured" in await s.error("runbook_list")
            assert (await s.ok("remember", content="still serving after all that"))["stored"]

    run(scenario)
    stderr_of(log)
    rows = conn.execute("SELECT content FROM episodes").fetchall()
    assert [r["content"] for r in rows] == ["still serving after all that"]


def test_an_argument_of_the_wrong_type_is_one_line_naming_it_without_pydantics_report(
    conn, memctl_env, log
):
    async def scenario():
        async with serving(log, "--agent", "a") as s:
            for tool, arguments, named in (
                ("fact_get", {"key": 5}, "key"),
                ("search", {"query": ["x"], "k": "many"}, "k"),
                ("remember", {"content": {"secret": GITHUB_TOKEN}}, "content"),
            ):
                said = await s.error(tool, **arguments)
                assert said.startswith(f"{tool}: invalid arguments: ") and f"{named}: " in said, (
                    said
                )
                assert "pydantic" not in said and "http" not in said and "\n" not in said, said
                assert (
                    GITHUB_TOKEN not in said and "many" not in said
                )  # the value sent is not sent back

    run(scenario)
    stderr_of(log, GITHUB_TOKEN)


def test_a_line_that_is_not_a_json_rpc_message_is_answered_with_an_error(memctl_env):
    lines = ["this is not json", json.dumps({"jsonrpc": "2.0", "id": 7, "method": 5}), "[1, 2]"]
    proc = subprocess.run(
        [memctl_exe(), "mcp", "--agent", "a"],
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(a["id"], a["error"]["code"]) for a in answers] == [
        (None, -32700),
        (7, -32600),
        (None, -32600),
    ]
    assert "Traceback" not in proc.stderr


def test_names_are_as_long_as_a_write_stores_them(conn, memctl_env, log):
    """A name (agent, kind, source, namespace) is bounded once, by the write path (values.MAX_NAME): a kind
    the command line stored, an MCP client can name; one character more is refused there and here."""
    longest = "k" * values.MAX_NAME
    seed(conn, "the ibis backup ran", agent="a", kind=longest)

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            found = await s.ok("search", query="ibis backup", kind=longest, mode="text")
            assert [r["kind"] for r in found["results"]] == [longest]
            assert str(values.MAX_NAME) in await s.error("search", query="ibis", kind=longest + "k")
            stored = await s.ok("remember", content="the ibis backup ran again", kind=longest)
            assert stored["stored"]

    run(scenario)
    assert (
        conn.execute("SELECT count(*) AS n FROM episodes WHERE kind = %s", (longest,)).fetchone()[
            "n"
        ]
        == 2
    )
    proc = subprocess.run(
        [memctl_exe(), "mcp", "--agent", "a" * (values.MAX_NAME + 1)],
        capture_output=True,
        text=True,
        timeout=60,
        input="",
        env=dict(os.environ),
    )
    assert proc.returncode == 2 and "--agent" in proc.stderr and str(values.MAX_NAME) in proc.stderr
    assert proc.stdout == ""


def test_search_since_and_until(conn, memctl_env, log):
    old = seed(conn, "the ibis backup ran", agent="a", created_at="2026-01-10T00:00:00Z")
    new = seed(conn, "the ibis backup ran again", agent="a", created_at="2026-03-10T00:00:00Z")

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            until = await s.ok("search", query="ibis backup", until="2026-02-01T00:00:00Z")
            since = await s.ok("search", query="ibis backup", since="2026-02-01T00:00:00Z")
            assert [r["id"] for r in until["results"]] == [old]
            assert [r["id"] for r in since["results"]] == [new]
            # until is exclusive (memctl.records.filters.UNTIL), since inclusive
            at = await s.ok(
                "search",
                query="ibis backup",
                since="2026-01-10T00:00:00Z",
                until="2026-03-10T00:00:00Z",
            )
            assert [r["id"] for r in at["results"]] == [old]

    run(scenario)
    # every hit returned counts as accessed, once per call that returned it
    counts = conn.execute(
        "SELECT episode_id, access_count FROM episode_access ORDER BY episode_id"
    ).fetchall()
    assert counts == [
        {"episode_id": old, "access_count": 2},
        {"episode_id": new, "access_count": 1},
    ]


def test_a_query_with_no_word_and_a_repeat_say_so(conn, memctl_env, log):
    """Punctuation alone searches nothing and the reply says why; remembering the same alert twice folds it."""
    seed(conn, "the ibis backup ran", agent="a")

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            noise = await s.ok("search", query="!!!")
            assert noise["results"] == [] and "no word" in noise["note"]
            first = await s.ok("remember", content="disk 91% on web-3")
            again = await s.ok("remember", content="Disk  91% on WEB-3")
            assert "folded_into" not in first and again["folded_into"] == first["id"]

    run(scenario)


# ------------------------------------------------------------ secrets


def test_a_secret_sent_to_remember_never_reaches_the_database(conn, memctl_env, log):
    secret_text = (
        f"deployed with token {GITHUB_TOKEN} against "
        f"postgresql://deploy:{URL_PASSWORD}@db.example/app"
    )

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            result = await s.call("remember", content=secret_text)
            assert not result.is_error
            stored = result.structured_content
            assert stored["stored"] and stored["redacted"] >= 2 and "redacted" in text(result)
            changed = await s.call("fact_set", key="ci.token", value=GITHUB_TOKEN)
            assert changed.structured_content["redacted"] == 1
            for shown in (
                result,
                changed,
                await s.call("episode_get", id=stored["id"]),
                await s.call("search", query="deployed token"),
            ):
                assert GITHUB_TOKEN not in json.dumps(shown.model_dump(mode="json"))
                assert URL_PASSWORD not in json.dumps(shown.model_dump(mode="json"))

    run(scenario)
    stderr_of(log, GITHUB_TOKEN, URL_PASSWORD)
    for table in ("episodes", "chunks", "facts", "fact_history", "embed_queue"):
        for secret in (GITHUB_TOKEN, URL_PASSWORD):
            row = conn.execute(
                f"SELECT count(*) AS n FROM {table} t WHERE strpos(t::text, %s) > 0",  # noqa: S608
                (secret,),
            ).fetchone()
            assert row["n"] == 0, table
    assert "[REDACTED:" in conn.execute("SELECT content FROM episodes").fetchone()["content"]


def test_block_mode_refuses_the_write(conn, memctl_env, log):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text('[redaction]\nmode = "block"\n')

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            refused = await s.error("remember", content=f"the token is {GITHUB_TOKEN}")
            assert "refused" in refused and GITHUB_TOKEN not in refused
            assert (await s.ok("remember", content="a harmless note"))["stored"]

    run(scenario)
    stderr_of(log, GITHUB_TOKEN)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 1


def test_a_blocked_source_is_refused(conn, memctl_env, log):
    from memctl.write import sources

    sources.block(conn, "mcp:a", "runaway agent")

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            assert "blocked" in await s.error("remember", content="let me in")
            assert "blocked" in await s.error("fact_set", key="k", value="v")
        async with serving(log, "--agent", "a", "--source", "mcp:a-v2") as s:
            assert (await s.ok("remember", content="a new source"))["source"] == "mcp:a-v2"

    run(scenario)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 1


# ------------------------------------------------------------ faults


def test_embedder_down_or_slow_search_and_recall_answer_from_text(
    conn, memctl_bin, ollama, ollama_env, log
):
    Path(ollama_env["MEMCTL_CONFIG"]).write_text("[embedding]\nsearch_timeout = 0.5\n")
    seed(conn, "the kestrel job ran out of memory on worker 4", agent="a")
    embed(memctl_bin)

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            assert not (await s.ok("search", query="kestrel memory"))["degraded"]
            for fault in ("down", "slow"):
                if fault == "down":
                    ollama.down()
                else:
                    ollama.inject("slow", delay_s=3)
                found = await s.call("search", query="kestrel memory")
                assert not found.is_error and found.structured_content["degraded"], fault
                assert found.structured_content["mode"] == "text" and "text search" in text(found)
                assert "kestrel" in found.structured_content["results"][0]["text"]
                recalled = await s.ok("recall", observation="kestrel job memory")
                assert recalled["degraded"] and "kestrel" in recalled["text"], fault
                assert any("text search" in w for w in recalled["warnings"])
                assert "embedder" in await s.error("search", query="kestrel", mode="vector")
                ollama.up()
                ollama.clear()
            assert not (await s.ok("search", query="kestrel memory"))["degraded"]

    run(scenario)
    stderr_of(log)


class Proxy:
    """127.0.0.1 in front of the test database: stop() is an outage, start() the recovery (same port)."""

    def __init__(self, db_url: str):
        info = conninfo_to_dict(db_url)
        host, port = info.get("host") or "/tmp", int(info.get("port") or 5432)
        if host.startswith("/"):
            self.family, self.target = socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
        else:
            self.family, self.target = socket.AF_INET, (info.get("hostaddr") or host, port)
        self.port = 0
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        listener.settimeout(0.1)
        self.port, self._listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.socket(self.family)
            upstream.connect(self.target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        while self._sockets:
            sock = self._sockets.pop()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def url(self, db_url: str, tmp_path: Path) -> str:
        fields = {"host": "127.0.0.1", "port": str(self.port), "hostaddr": None}
        passfile = conninfo_to_dict(db_url).get("passfile") or os.environ.get("PGPASSFILE")
        if passfile and Path(passfile).exists():  # the same entries, for the proxy's port
            copy = tmp_path / "pgpass"
            lines = [
                line.split(":")
                for line in Path(passfile).read_text().splitlines()
                if line.count(":") >= 4
            ]
            copy.write_text("".join(f"*:*:{':'.join(parts[2:])}\n" for parts in lines))
            copy.chmod(0o600)
            fields["passfile"] = str(copy)
        return make_conninfo(db_url, **fields)


def test_database_down_mid_session_is_a_tool_error_and_the_session_survives(
    conn, db_url, memctl_env, log, tmp_path
):
    proxy = Proxy(db_url)
    proxy.start()
    seed(conn, "the osprey cache was cold", agent="a")

    async def scenario():
        async with serving(
            log, "--agent", "a", env={"MEMCTL_DATABASE_URL": proxy.url(db_url, tmp_path)}
        ) as s:
            assert len((await s.ok("search", query="osprey cache"))["results"]) == 1
            # the held connection cut from the server's side: reopened at the next call, unseen
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert len((await s.ok("search", query="osprey cache"))["results"]) == 1
            proxy.stop()
            for tool, arguments in (
                ("search", {"query": "osprey"}),
                ("remember", {"content": "lost?"}),
                ("fact_get", {"key": "k"}),
                ("recall", {"observation": "osprey cache"}),
            ):
                message = await s.error(tool, **arguments)
                assert message.startswith("database unavailable"), (tool, message)
            assert await s.tool_names() == TOOLS  # the session is alive
            proxy.start()
            assert (await s.ok("remember", content="the osprey cache is warm again"))["stored"]

    try:
        run(scenario)
    finally:
        proxy.stop()
    assert "database unavailable" in stderr_of(log)
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 2


def test_an_unreachable_database_never_shows_its_password(memctl_env, log):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://memctl:{URL_PASSWORD}@127.0.0.1:{port}/memctl"

    async def scenario():
        async with serving(log, "--agent", "a", env={"MEMCTL_DATABASE_URL": url}) as s:
            for tool, arguments in (("search", {"query": "x"}), ("remember", {"content": "x"})):
                message = await s.error(tool, **arguments)
                assert message.startswith("database unavailable") and URL_PASSWORD not in message
            assert await s.tool_names() == TOOLS

    run(scenario)
    stderr_of(log, URL_PASSWORD)


def test_the_embedded_server_is_started_on_demand_and_again_after_a_stop(log, tmp_path):
    """No database configured: the first call starts the embedded server; stopped mid-session, the next starts it."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="memctl-test-mcp-"))  # under /tmp, never a home directory
    config_file = tmp_path / "empty.toml"
    config_file.write_text("")
    env = {
        "MEMCTL_HOME": str(home),
        "MEMCTL_CONFIG": str(config_file),
        "MEMCTL_DATABASE_URL": "",
        "MEMCTL_EMBEDDER": "hash",
        "MEMCTL_EMBED_MODEL": "hash-embed",
    }

    def memctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [memctl_exe(), *args],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=180,
        )

    async def scenario():
        async with serving(log, "--agent", "a", env=env) as s:
            first = await s.ok("remember", content="the embedded server came up for this")
            assert memctl("db", "stop").returncode == 0
            assert (
                json.loads(memctl("db", "status", "-f", "json").stdout)["embedded_running"] is False
            )
            found = await s.ok("search", query="embedded server came up")
            assert [r["id"] for r in found["results"]] == [first["id"]]

    try:
        run(scenario)
    finally:
        memctl("db", "stop")
        shutil.rmtree(home, ignore_errors=True)
    stderr_of(log)


def test_twenty_concurrent_calls_in_one_session(conn, memctl_env, log):
    seed(conn, "the plover service restarted", agent="a")

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            results: dict[int, dict] = {}

            async def one(i: int) -> None:
                if i % 4 == 0:
                    results[i] = await s.ok("fact_set", key=f"k{i}", value=f"v{i}")
                elif i % 4 == 1:
                    results[i] = await s.ok("search", query="plover service")
                else:
                    results[i] = await s.ok("remember", content=f"concurrent note {i}")

            async with anyio.create_task_group() as group:
                for i in range(20):
                    group.start_soon(one, i)
            assert len(results) == 20
            ids = [r["id"] for i, r in results.items() if i % 4 >= 2]
            assert len(ids) == len(set(ids)) == 10
            assert all(len(results[i]["results"]) >= 1 for i in results if i % 4 == 1)

    run(scenario)
    stderr_of(log)
    assert (
        conn.execute("SELECT count(*) AS n FROM episodes WHERE agent = 'a'").fetchone()["n"] == 11
    )
    assert (
        conn.execute("SELECT count(*) AS n FROM facts WHERE namespace = 'a'").fetchone()["n"] == 5
    )


# ------------------------------------------------------------ the process


def test_stdout_carries_only_the_protocol(memctl_env):
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "remember", "arguments": {"content": "raw wire"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "raw", "k": "x"}},
        },
        # a lone surrogate: valid JSON (json.dumps writes the escape), not valid Unicode text; the SDK's
        # transport drops it or answers an error, and the server goes on either way
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "remember", "arguments": {"content": "a \ud800 b"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "fact_list", "arguments": {}},
        },
    ]
    proc = subprocess.Popen(
        [memctl_exe(), "mcp", "--agent", "a"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    timer = threading.Timer(
        120, proc.kill
    )  # a server that never answers fails the test, never hangs it
    timer.start()
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.flush()
        replies = []
        # requests run concurrently, so answers come in any order (a write may answer after a later read)
        while not {1, 2, 3, 5} <= {r.get("id") for r in replies}:
            replies.append(json.loads(proc.stdout.readline()))  # every line a JSON-RPC message
        proc.stdin.close()  # the client leaves: the server ends
        rest, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait() == 0, err
    finally:
        timer.cancel()
    replies += [
        json.loads(line) for line in rest.splitlines()
    ]  # a late answer to 4: still only the protocol
    by_id = {r["id"]: r for r in replies}
    assert {1, 2, 3, 5} <= set(by_id) <= {1, 2, 3, 4, 5} and all(
        r["jsonrpc"] == "2.0" for r in replies
    )
    assert by_id[2]["result"]["structuredContent"]["stored"] is True
    assert by_id[3]["result"]["isError"] is True
    assert 4 not in by_id or "error" in by_id[4] or by_id[4]["result"]["isError"]
    assert by_id[5]["result"]["isError"] is False
    assert "Traceback" not in err
    assert all(line.startswith("memctl: ") for line in err.splitlines()), err


def test_a_client_that_closes_its_input_at_once_still_gets_every_answer(conn, memctl_env):
    """`printf requests | memctl mcp`, or the protocol's shutdown: the client sends, closes stdin, reads.

    The SDK cancels the requests still running at the end of input; memctl.mcp.transport holds that end
    back until each is answered, so every write made is also reported (it was made but never reported)."""
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ] + [
        {
            "jsonrpc": "2.0",
            "id": 10 + i,
            "method": "tools/call",
            "params": {"name": "remember", "arguments": {"content": f"disk note {i} on web-{i}"}},
        }
        for i in range(20)
    ]
    proc = subprocess.Popen(
        [memctl_exe(), "mcp", "--agent", "a"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    timer = threading.Timer(120, proc.kill)
    timer.start()
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.close()  # before a single answer is read
        out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait() == 0, err
    finally:
        timer.cancel()
    answers = {r["id"]: r for r in map(json.loads, out.splitlines())}
    assert set(answers) == {1} | set(range(10, 30))
    stored = {answers[i]["result"]["structuredContent"]["id"] for i in range(10, 30)}
    assert all(answers[i]["result"]["structuredContent"]["stored"] for i in range(10, 30))
    rows = conn.execute("SELECT id FROM episodes WHERE agent = 'a'").fetchall()
    assert {r["id"] for r in rows} == stored and len(stored) == 20
    assert "Traceback" not in err


def test_what_is_owed_is_each_request_read_until_answered_or_cancelled():
    from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

    from memctl.mcp.transport import Owed

    owed = Owed()
    for i in (1, "two", 3):
        owed.read(JSONRPCRequest(jsonrpc="2.0", id=i, method="tools/call", params={}))
    owed.read(JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized"))
    assert owed.ids == {1, "two", 3}
    owed.written(JSONRPCResponse(jsonrpc="2.0", id=1, result={}))
    owed.written(JSONRPCError(jsonrpc="2.0", id="two", error={"code": -32602, "message": "bad"}))
    assert owed.ids == {3}
    owed.read(
        JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled", params={"requestId": 3}
        )
    )
    assert owed.ids == set()


def test_other_commands_do_not_import_the_sdk(memctl_env):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "memctl", "fact", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "memctl.records.facts" in imported
    assert not {name for name in imported if name.split(".")[0] in ("mcp", "mcp_types")}
    assert "memctl.mcp.protocol" not in imported and "memctl.mcp.tools" not in imported


def test_bad_options_exit_2_before_serving(memctl_env):
    proc = subprocess.run(
        [memctl_exe(), "mcp", "--shared-namespace", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        input="",
        env=dict(os.environ),
    )
    assert proc.returncode == 2 and "needs --agent" in proc.stderr and proc.stdout == ""
