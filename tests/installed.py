"""The installed memctl the tests run: the one beside this Python, so that another venv on PATH is never taken
(step 1 runs `.venv-ollama`'s, installed as production installs it: docs/testing.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def memctl_exe() -> str:
    beside = Path(sys.executable).parent / "memctl"
    exe = str(beside) if beside.exists() else shutil.which("memctl")
    assert exe, "no memctl installed beside this Python or on PATH"
    return exe


def start_ingest(env: dict, *args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
    """`memctl ingest ARGS` running, with ENV over this process's environment, its stdout and stderr piped."""
    return subprocess.Popen(
        [memctl_exe(), "ingest", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
