"""A full disk: every write meets it with exit 5 naming the disk, nothing half written, and resumes once freed.

The embedded server's MEMCTL_HOME is a size-limited tmpfs mounted for this module (root only). A filler
file takes the last byte; the commands run as the installed `memctl` in subprocesses, as an operator's
would; the filler goes; the same commands succeed with no other step.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from memctl.errors import EXIT_DISK_FULL

DISK_MB = 160  # an empty cluster with memctl's schema takes about 45 MB, a WAL segment 16 MB of it
BIG = (
    300_000  # characters: a write this size cannot fit in the free room of pages already allocated
)


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    exe = str(beside) if beside.exists() else shutil.which("memctl")
    assert exe, "no memctl installed beside this Python or on PATH"
    return exe


@pytest.fixture(scope="module")
def disk():
    """(mount point, run) for a tmpfs of DISK_MB holding MEMCTL_HOME; run(*args) -> CompletedProcess."""
    if os.environ.get("MEMCTL_TEST_DATABASE_URL"):
        pytest.skip(
            "fills the embedded server's disk; with MEMCTL_TEST_DATABASE_URL the suite is about that "
            "server, whose disk a test cannot fill"
        )
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a size-limited tmpfs for the data directory")
    mount = Path(tempfile.mkdtemp(prefix="memctl-diskfull-", dir="/var/tmp"))
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        mount.rmdir()
        pytest.skip(
            f"cannot mount a tmpfs here ({made.stderr.strip()}): needs root with CAP_SYS_ADMIN"
        )
    config = Path(tempfile.mkdtemp(prefix="memctl-diskfull-cfg-")) / "config.toml"
    config.write_text(
        "[limits]\nvalue_bytes = 1048576\n"
    )  # a fact value of BIG characters (the default is 64 KiB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMCTL_", "PG"))}
    env.update(
        MEMCTL_HOME=str(mount / "home"),
        MEMCTL_CONFIG=str(config),
        MEMCTL_EMBEDDER="hash",
        MEMCTL_EMBED_MODEL="hash-embed",
    )

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_memctl(), *args], env=env, input=input, capture_output=True, text=True, timeout=120
        )

    try:
        yield mount, run
    finally:
        run("db", "stop")
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()
        shutil.rmtree(config.parent, ignore_errors=True)


def _fill(mount: Path) -> Path:
    """A filler file that takes every free byte of the disk."""
    filler = mount / "filler"
    block = b"\0" * 2**20
    with open(filler, "wb", buffering=0) as handle:
        for size in (2**20, 4096):
            try:
                while True:
                    handle.write(block[:size])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    assert os.statvfs(mount).f_bavail == 0
    return filler


def _words(n: int, seed: str) -> str:
    """N characters of text (words, not noise: the secret detector must not take it for a key)."""
    import random

    rng = random.Random(seed)
    vocabulary = [
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
    ]
    out, length = [], 0
    while length < n:
        word = f"{rng.choice(vocabulary)}{rng.randrange(10_000)}"
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def _counts(run) -> dict[str, int]:
    url = run("db", "url").stdout.strip()
    assert url, "memctl db url printed nothing"
    with psycopg.connect(url, autocommit=True) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - fixed names
            for table in ("episodes", "chunks", "embed_queue", "facts", "fact_history")
        }


def _commands(mount: Path, batch: Path, tag: str) -> dict[str, tuple[list[str], str | None]]:
    """Each write, as (arguments, stdin): the big texts go through stdin, past the kernel's argument limit."""
    return {
        "episode add": (
            ["episode", "add", "-", "--source", "disk-test"],
            _words(BIG, f"episode-{tag}"),
        ),
        "fact set": (
            ["fact", "set", f"disk.{tag}", "-", "--source", "disk-test"],
            _words(BIG, f"fact-{tag}"),
        ),
        "episode import": (["episode", "import", str(batch)], None),
        "export --out": (["export", "--out", str(mount / "export.jsonl")], None),
    }


def test_a_full_disk_refuses_every_write_whole_and_writes_resume_once_freed(disk, tmp_path):
    mount, run = disk
    seeded = run(
        "fact", "set", "disk.seed", "1"
    )  # starts the server on the small disk and migrates it
    assert seeded.returncode == 0, seeded.stderr
    batch = tmp_path / "batch.jsonl"  # the import file itself lives off the full disk
    batch.write_text(
        "".join(
            json.dumps({"content": f"batch {n}: " + _words(2_000, f"b{n}")}) + "\n"
            for n in range(200)
        )
    )
    before = _counts(run)

    filler = _fill(mount)
    try:
        for name, (args, stdin) in _commands(mount, batch, "full").items():
            out = run(*args, input=stdin)
            assert out.returncode == EXIT_DISK_FULL, (name, out.returncode, out.stderr)
            assert "Traceback" not in out.stderr, (name, out.stderr)
            assert "disk full" in out.stderr and str(mount) in out.stderr, (name, out.stderr)
            assert len(out.stderr.strip().splitlines()) == 1, (name, out.stderr)  # one clear line
            assert out.stdout == "", (name, out.stdout)
        left = sorted(p.name for p in mount.iterdir())
        assert left == ["filler", "home"], f"the failed export left {left} on the disk"
    finally:
        filler.unlink()

    assert _counts(run) == before, "a write that met the full disk left part of itself behind"
    for name, (args, stdin) in _commands(mount, batch, "freed").items():
        out = run(*args, input=stdin)
        assert out.returncode == 0, (name, out.returncode, out.stderr)
    after = _counts(run)
    assert after["episodes"] == before["episodes"] + 1 + 200
    assert after["facts"] == before["facts"] + 1
    assert after["chunks"] > before["chunks"] + 200
    records = [json.loads(line) for line in (mount / "export.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "episode" for r in records) == after["episodes"]


def test_a_server_that_cannot_start_on_a_full_disk_says_so_and_starts_once_freed(disk):
    mount, run = disk
    assert run("fact", "set", "disk.start", "1").returncode == 0
    assert run("db", "stop").returncode == 0
    filler = _fill(mount)
    try:
        out = run("fact", "get", "disk.start")
        assert out.returncode == EXIT_DISK_FULL, (out.returncode, out.stderr)
        assert "cannot start" in out.stderr and str(mount) in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, (
            out.stderr
        )
    finally:
        filler.unlink()
    out = run("fact", "get", "disk.start")
    assert (out.returncode, out.stdout) == (0, "1\n"), out.stderr
