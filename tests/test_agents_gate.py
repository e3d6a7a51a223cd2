"""The write gate works in every role it runs in: a registered agent, served in its own role over stdio and
over HTTP, writes each kind of record the gate makes, and the owner reads back what the gate made.

Before sql/0023 a registered agent's `remember` of a text holding a secret answered "permission denied for
table fold_key" and stored nothing: the gate read a table the agent's role may not read. What the gate reads
for an agent now comes through narrow functions (memctl_fold_key, memctl_blocked, memctl_lock*).
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from memctl import db

from tests.fix_mcp import URL_PASSWORD, as_agent, serving


PASSWORD_TEXT = f"the staging db password is {URL_PASSWORD} for user app"


@pytest.fixture
def registered(agents_db_url, memctl_env, memctl_bin, monkeypatch):
    """An agent registered (its role made), with a token, in a database whose owner may make roles: (name, token)."""
    monkeypatch.setenv("MEMCTL_DATABASE_URL", agents_db_url)
    memctl_env["MEMCTL_DATABASE_URL"] = agents_db_url
    name = f"gate_{uuid.uuid4().hex[:8]}"
    assert memctl_bin("agent", "add", name).exit_code == 0
    token = memctl_bin("agent", "token", name).stdout.strip()
    yield name, token, agents_db_url
    memctl_bin("agent", "revoke", name)


async def _writes(served, memctl_bin, name: str) -> dict:
    """Every kind of record through the gate, as the agent: what each answered."""
    said = {"secret": await served.ok("remember", content=PASSWORD_TEXT)}
    said["secret_again"] = await served.ok("remember", content=PASSWORD_TEXT)
    said["plain"] = await served.ok("remember", content="the deploy of api v3 finished")
    said["repeat"] = await served.ok("remember", content="the deploy of api v3 finished")
    said["fact"] = await served.ok("fact_set", key="db.password", value=URL_PASSWORD)
    await served.ok("fact_set", key="db.port", value="5432")
    said["fact_again"] = await served.ok("fact_set", key="db.port", value="5433")
    assert memctl_bin("source", "block", f"mcp:{name}", "--reason", "a test").exit_code == 0
    said["blocked_episode"] = await served.error("remember", content="after the block")
    said["blocked_fact"] = await served.error("fact_set", key="db.port", value="1")
    return said


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_registered_agent_writes_every_kind_of_record_through_the_gate(
    registered, transport, memctl_env, memctl_bin, http_server, tmp_path
):
    name, token, url = registered
    log = tmp_path / "mcp.log"

    async def scenario():
        if transport == "stdio":
            async with serving(log, "--agent", name, env=memctl_env) as served:
                return await _writes(served, memctl_bin, name)
        with http_server(memctl_env, log) as url:
            async with as_agent(url, token) as served:
                return await _writes(served, memctl_bin, name)

    said = anyio.run(scenario)
    assert URL_PASSWORD not in log.read_text()
    assert said["secret"]["stored"] and said["secret"]["redacted"] >= 1
    assert (
        said["secret_again"]["folded_into"] == said["secret"]["id"]
    )  # the fold key, read through memctl_fold_key
    assert said["repeat"]["folded_into"] == said["plain"]["id"]
    assert "blocked" in said["blocked_episode"] and "blocked" in said["blocked_fact"]
    with db.connect(url) as conn:  # the owner reads back what the gate made
        rows = conn.execute(
            "SELECT id, agent, content, repeats, repeat_of FROM episodes ORDER BY id"
        ).fetchall()
        values = {
            r["key"]: (r["value"], r["version"])
            for r in conn.execute("SELECT key, value, version FROM facts")
        }
        history = conn.execute(
            "SELECT count(*) AS n FROM fact_history WHERE strpos(coalesce(new_value, ''), %s) > 0",
            (URL_PASSWORD,),
        ).fetchone()["n"]
    assert [r["agent"] for r in rows] == [name] * 4
    assert (
        all(URL_PASSWORD not in r["content"] for r in rows) and "[REDACTED:" in rows[0]["content"]
    )
    assert [r["repeats"] for r in rows if r["repeat_of"] is None] == [1, 1]
    assert URL_PASSWORD not in values["db.password"][0] and "[REDACTED" in values["db.password"][0]
    assert values["db.port"] == ("5433", 2) and history == 0
