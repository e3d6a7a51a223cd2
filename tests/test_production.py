"""What production runs: the installed `memctl` with Ollama, and no extra.

CI runs this file (with the rest of the Ollama-path tests) in a venv made by `pip install
'.[test]'`: the README's Ollama install plus pytest and nothing else, with
MEMCTL_TEST_PROFILE=production and the test server's all-minilm computed by a helper process
(tests/minilm_worker.py). Tests that assert facts of that environment skip elsewhere; the
fault matrix, the batch search and `--mode vector` hold for any install and run everywhere.
Every memctl here is the installed binary in a subprocess (the memctl_bin fixture).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.ollama_server import MINILM_PYTHON_ENV, OllamaTestServer

CHECKOUT = Path(__file__).resolve().parents[1]
PRODUCTION = os.environ.get("MEMCTL_TEST_PROFILE") == "production"
production_only = pytest.mark.skipif(
    not PRODUCTION,
    reason="asserts facts of the production install: needs MEMCTL_TEST_PROFILE=production in a venv made by "
    "pip install '.[test]' (the README's Tests block runs it so)",
)
HEAVY = ("numpy", "torch", "sentence_transformers", "transformers", "onnxruntime")


def memctl(memctl_bin, *args: str, env: dict | None = None, input: str | None = None):
    """The installed memctl; whatever it answers, stderr is memctl's own lines, never a traceback."""
    outcome = memctl_bin(*args, env=env, input=input)
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert all(line.startswith("memctl: ") for line in outcome.stderr.splitlines()), outcome.stderr
    return outcome


# ------------------------------------------------------------ the environment


@production_only
def test_memctl_is_the_installed_package_not_the_checkout():
    import memctl

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(memctl.__file__).resolve().is_relative_to(site), memctl.__file__
    assert not Path(memctl.__file__).resolve().is_relative_to(CHECKOUT / "memctl")
    assert CHECKOUT not in {Path(p or ".").resolve() for p in sys.path}
    direct_url = importlib.metadata.distribution("memctl").read_text("direct_url.json") or "{}"
    assert not json.loads(direct_url).get("dir_info", {}).get("editable", False)
    # A Python the tests start from the checkout (`python -c`) must not find the checkout either.
    code = "import memctl; print(memctl.__file__)"
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=CHECKOUT, capture_output=True, text=True, check=True
    )
    assert Path(child.stdout.strip()).resolve().is_relative_to(site), child.stdout


def _test_extra() -> list[str]:
    """The test extra's distributions, as pyproject.toml names them (the one statement of the test tools)."""
    import re
    import tomllib

    project = tomllib.loads(
        (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    )["project"]
    return [
        re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0]
        for spec in project["optional-dependencies"]["test"]
    ]


def _requirement_closure(roots: list[str]) -> set[str]:
    """Distribution names reachable from roots through installed, marker-selected requirements."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = [(root, frozenset()) for root in roots]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # optional elsewhere; an absent package cannot hide anything
        seen.add(key)
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in envs):
                if canonicalize_name(req.name) not in seen:
                    todo.append((req.name, frozenset(req.extras)))
    return seen


@production_only
def test_the_production_venv_has_the_base_install_and_the_test_tools_only():
    for module in HEAVY:
        assert importlib.util.find_spec(module) is None, (
            f"{module} is importable in the production venv"
        )
    from packaging.utils import canonicalize_name

    installed = {canonicalize_name(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    allowed = _requirement_closure(["memctl", *_test_extra()]) | {"pip", "setuptools", "wheel"}
    assert installed - allowed == set(), (
        "installed beyond memctl's base dependencies and the test tools'"
    )


@production_only
def test_ci_computes_real_all_minilm_in_a_helper_process(ollama):
    """In CI the server's all-minilm is the real network from the .venv's Python, not the stand-in."""
    assert ollama.minilm_source == "worker" and ollama.real_minilm
    from memctl.embedding.ollama import OllamaEmbedder

    query, paraphrase, unrelated = (
        OllamaEmbedder("all-minilm", host=ollama.url)
        .embed(
            [
                "The database server ran out of disk space.",
                "The DB host's disk filled up completely.",
                "My cat enjoys sleeping in the afternoon sun.",
            ]
        )
        .vectors
    )
    assert dot(query, paraphrase) > dot(query, unrelated) + 0.2


def dot(a, b):
    return math.fsum(x * y for x, y in zip(a, b))


@production_only
def test_the_local_embedder_without_its_extra_is_one_clear_line(memctl_bin, memctl_env):
    assert memctl(memctl_bin, "episode", "add", "the disk filled up").exit_code == 0
    local = {"MEMCTL_EMBEDDER": "local", "MEMCTL_EMBED_MODEL": "all-minilm"}
    outcome = memctl(memctl_bin, "embed", env=local)
    assert (
        outcome.exit_code == 3
    )  # an embedder that cannot load is unavailable, like one that is down
    assert len(outcome.stderr.splitlines()) == 1 and "memctl[local]" in outcome.stderr, (
        outcome.stderr
    )
    found = memctl(
        memctl_bin, "episode", "search", "disk filled", "-f", "json", "--no-track", env=local
    )
    assert (
        found.exit_code == 0 and "disk filled" in found.stdout
    )  # search degrades to words, as promised


# ------------------------------------------------------------ the fault matrix

COMMANDS = {
    "add": ("episode", "add", "the disk on web1 filled up again", "--source", "matrix"),
    "embed": ("embed",),
    "search": ("episode", "search", "disk full on web1", "-f", "json", "--no-track"),
    "vector": ("episode", "search", "disk full on web1", "--mode", "vector", "--no-track"),
    "recall": ("recall", "the disk is full on web1", "--no-track"),
    "status": ("status",),
}
# Exit codes (README): 0 ok, also search degraded to text with a warning; 1 error;
# 3 a dependency (database, embedder) unavailable. `--mode vector` is never answered by text.
# A missing extra is the embedder unavailable, as when Ollama is down: one line naming the extra; search
# and recall answer from words (0), what needs vectors exits 3.
MATRIX = {
    #                       add embed search vector recall status
    "ollama-down": (0, 3, 0, 3, 0, 0),
    "ollama-slow": (0, 3, 0, 3, 0, 0),
    "ollama-500": (0, 3, 0, 3, 0, 0),
    "ollama-404": (0, 1, 0, 3, 0, 0),
    "database-unreachable": (3, 3, 3, 3, 3, 3),
    "config-broken": (1, 1, 1, 1, 1, 1),
    "extra-missing": (0, 3, 0, 3, 0, 0),
}
SECRET = "matrix-pw-6f1c"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _apply(case: str, ollama, memctl_env) -> dict:
    """Bring the fault about; the environment memctl runs with."""
    config = Path(memctl_env["MEMCTL_CONFIG"])
    if case == "ollama-down":
        ollama.down()
    elif case == "ollama-slow":
        config.write_text("[embedding]\ntimeout = 0.5\nsearch_timeout = 0.5\n")
        ollama.inject("slow", delay_s=3)
    elif case in ("ollama-500", "ollama-404"):
        ollama.inject(case.removeprefix("ollama-"))
    elif case == "database-unreachable":
        return {
            "MEMCTL_DATABASE_URL": f"postgresql://memctl:{SECRET}@127.0.0.1:{closed_port()}/memctl"
        }
    elif case == "config-broken":
        config.write_text("[embedding\nmodel = \n")
    elif case == "extra-missing":
        return {"MEMCTL_EMBEDDER": "local", "MEMCTL_EMBED_MODEL": "all-minilm"}
    return {}


@pytest.mark.parametrize("case", list(MATRIX))
def test_fault_matrix_exit_codes_and_never_a_traceback(case, cli, memctl_bin, ollama, ollama_env):
    if case == "extra-missing" and importlib.util.find_spec("tokenizers") is not None:
        pytest.skip(
            "the local extra is installed here: the missing-extra case runs in the production venv"
        )
    for text in ("web1 disk full: rotated nginx logs", "the redis replica lagged behind"):
        assert cli("episode", "add", text).exit_code == 0
    if case != "extra-missing":  # with a model registered, embed would follow the database's model
        assert cli("embed").exit_code == 0
    env = _apply(case, ollama, ollama_env)
    got = {}
    for (name, args), expected in zip(COMMANDS.items(), MATRIX[case]):
        outcome = memctl(memctl_bin, *args, env=env)
        got[name] = outcome.exit_code
        assert SECRET not in outcome.stdout + outcome.stderr
        if outcome.exit_code != 0:
            assert outcome.stderr.strip(), f"{name}: exit {outcome.exit_code} without a message"
        elif name in ("search", "recall") and case.startswith("ollama-"):
            assert "text search" in outcome.stderr, (
                f"{name}: degraded without saying so: {outcome.stderr!r}"
            )
        if case == "extra-missing" and outcome.exit_code == 1:
            assert "memctl[local]" in outcome.stderr and len(outcome.stderr.splitlines()) == 1, (
                outcome.stderr
            )
        if case == "config-broken":
            assert ollama_env["MEMCTL_CONFIG"] in outcome.stderr, (
                f"{name}: the broken file is not named"
            )
    assert got == dict(zip(COMMANDS, MATRIX[case]))


# ------------------------------------------------------------ search as production runs it

PARAPHRASES = {
    "The primary database ran out of storage because old logs were never rotated.": "Why did the main DB fill its volume?",
    "Customers could not sign in after the TLS certificate expired on the load balancer.": "Why were clients unable to authenticate?",
    "The nightly backup job was moved to 3am so it no longer slows the morning traffic.": "At what time does the archive task start?",
    "Our cloud bill doubled when someone left forty GPU machines running over the weekend.": "Why did we pay so much for compute?",
}


def _import(memctl_bin, texts) -> None:
    lines = "".join(json.dumps({"content": t, "agent": "ops"}) + "\n" for t in texts)
    outcome = memctl(memctl_bin, "episode", "import", "-", input=lines)
    assert outcome.exit_code == 0, outcome.stderr


@pytest.mark.real_minilm
def test_import_embed_and_vector_search_find_paraphrases(memctl_bin, ollama, ollama_env):
    _import(memctl_bin, PARAPHRASES)
    embedded = memctl(memctl_bin, "embed")
    assert embedded.exit_code == 0, embedded.stderr
    status = json.loads(memctl(memctl_bin, "status", "-f", "json").stdout)
    assert status["pending"] == 0
    contents = list(PARAPHRASES)
    for answer, question in PARAPHRASES.items():
        found = memctl(
            memctl_bin,
            "episode",
            "search",
            question,
            "--mode",
            "vector",
            "-k",
            "1",
            "--no-track",
            "-f",
            "json",
        )
        assert (found.exit_code, found.stderr) == (0, "")
        [hit] = json.loads(found.stdout)
        assert hit["vector_rank"] == 1 and contents.index(hit["content"]) == contents.index(answer)


SERVICES = [
    "postgres",
    "nginx",
    "redis",
    "kafka",
    "the api",
    "the backup job",
    "dns",
    "the load balancer",
]
SYMPTOMS = [
    "ran out of disk",
    "restarted in a loop",
    "answered slowly",
    "refused connections",
    "lost its replica",
    "filled the logs",
    "used all memory",
    "expired its certificate",
]


@pytest.mark.real_minilm
def test_a_1000_query_batch_runs_its_vector_half(memctl_bin, ollama, ollama_env):
    """Query embeddings go in sub-batches, each under the search timeout: almost every query gets vector hits.

    The timeout is 3x the default so that a loaded shared machine does not fail it; the request sizes are
    checked too (all 1,000 in one request is about 6 s of MiniLM on 2 cores).
    """
    Path(ollama_env["MEMCTL_CONFIG"]).write_text("[embedding]\nsearch_timeout = 6.0\n")
    _import(
        memctl_bin,
        [
            f"{s} on host{i} {y}; the on-call fixed it"
            for i, (s, y) in enumerate((s, y) for s in SERVICES for y in SYMPTOMS)
        ],
    )
    assert memctl(memctl_bin, "embed").exit_code == 0
    queries = [
        {
            "query": f"why {SERVICES[i % 8]} {SYMPTOMS[(i // 8) % 8]} on host{i % 97}, case {i}",
            "k": 3,
        }
        for i in range(1000)
    ]
    ollama.requests.clear()
    outcome = memctl(
        memctl_bin,
        "episode",
        "search",
        "--batch",
        "-",
        "--no-track",
        input="".join(json.dumps(q) + "\n" for q in queries),
    )
    assert outcome.exit_code == 0, outcome.stderr
    lines = [json.loads(line) for line in outcome.stdout.splitlines()]
    assert [line["query"] for line in lines] == [q["query"] for q in queries]
    with_vectors = sum(any(r["vector_rank"] is not None for r in line["results"]) for line in lines)
    assert with_vectors >= 966, (
        f"{with_vectors} of 1000 queries got vector hits; stderr: {outcome.stderr}"
    )
    sizes = [n for _, _, n in ollama.embed_requests()]
    assert sum(sizes) >= 1000 and max(sizes) <= 64, (
        sizes
    )  # sub-batches, not one request for all 1,000


# ------------------------------------------------------------ the test server's helper process


@pytest.mark.local
def test_the_helper_process_gives_the_in_process_vectors(monkeypatch):
    """tests/minilm_worker.py: started on first use, one process for many requests, gone after stop()."""
    from memctl.embedding.local import LocalEmbedder
    from memctl.embedding.ollama import OllamaEmbedder

    monkeypatch.setenv(MINILM_PYTHON_ENV, sys.executable)
    texts = ["rotating logs fixed the full disk", "the certificate expired", "x " * 20]
    with OllamaTestServer() as server:
        worker = server.models["all-minilm"].embed
        assert server.minilm_source == "worker" and worker.pid is None
        client = OllamaEmbedder("all-minilm", host=server.url)
        served = client.embed(texts).vectors
        pid = worker.pid
        again = client.embed(texts[:1]).vectors[
            0
        ]  # alone, not in a batch: equal up to float rounding
        assert (
            pid is not None
            and worker.pid == pid
            and dot(again, served[0]) == pytest.approx(1.0, abs=1e-6)
        )
        assert server.errors == []
    assert worker.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    local = LocalEmbedder().embed(texts).vectors
    for a, b in zip(served, local):
        assert dot(a, b) == pytest.approx(1.0, abs=1e-6)


# ------------------------------------------------------------ the test database's role


class _Marked:
    """What conftest's _requirements reads of pytest's request: a test's markers and the pg_role fixture."""

    def __init__(self, marker, role):
        self.node = self
        self._marker, self._role = marker, role

    def get_closest_marker(self, name: str):
        return self._marker if name == self._marker.name else None

    def getfixturevalue(self, name: str):
        assert name == "pg_role", name
        return self._role


def test_the_superuser_marker_skips_exactly_the_roles_the_server_says_are_no_superuser(
    pg_server, pg_role
):
    """conftest's own marker check and pg_roles reading, for the tests' role and (as a superuser) a plain one."""
    import uuid

    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    from tests import conftest

    requirements, read_role = conftest._requirements.__wrapped__, conftest.pg_role.__wrapped__
    marker = pytest.mark.superuser("a test of the marker").mark
    plain = f"memctl_plain_{uuid.uuid4().hex[:10]}"
    roles = [pg_role]
    with psycopg.connect(pg_server, autocommit=True) as admin:
        if pg_role.superuser:  # a login role with no attribute: what the server says of it decides
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(plain)))
        try:
            if pg_role.superuser:
                roles.append(read_role(make_conninfo(pg_server, user=plain)))
            assert [r.superuser for r in roles] == ([True, False] if pg_role.superuser else [False])
            for role in roles:
                if role.superuser:  # runs (a skip raised here would skip this test, not fail it)
                    try:
                        requirements(_Marked(marker, role))
                    except pytest.skip.Exception as exc:
                        pytest.fail(f"the marker skipped a superuser: {exc}")
                else:
                    with pytest.raises(
                        pytest.skip.Exception, match=f"the test role {role.name!r} is not one"
                    ):
                        requirements(_Marked(marker, role))
        finally:
            if (
                pg_role.superuser
            ):  # made only then; a role without CREATEROLE may not even DROP ... IF EXISTS
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(plain)))


def test_an_unprivileged_test_role_has_what_the_suite_needs(pg_role, pg_server):
    """The operator's own server (tests/ci/own-postgres.sh): CREATEDB, and `vector` made once in template1."""
    if pg_role.superuser:
        pytest.skip("the test role is a superuser, which has every privilege this checks")
    import psycopg

    with psycopg.connect(pg_server) as conn:
        createdb = conn.execute(
            "SELECT rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone()[0]
    assert createdb and pg_role.vector_in_template1 and not pg_role.embedded
