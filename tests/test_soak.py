"""The soak's short profile: two minutes of writes, embedding, search and upkeep under every kind of fault.

tests/bench/soak.py runs the installed memctl against an embedded server on a tmpfs it mounts, and
checks what the database holds against what each command acknowledged; see its docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).with_name("bench") / "soak.py"
FAULT_KINDS = {"kill_embed_worker", "kill_import", "ollama_restart", "kill_postmaster", "disk_full"}


def _can_mount() -> str | None:
    """Why a size-limited filesystem cannot be mounted here, or None."""
    if os.geteuid() != 0:
        return "needs root to mount a size-limited tmpfs for the data directory"
    import tempfile

    probe = tempfile.mkdtemp(prefix="memctl-soak-probe-", dir="/var/tmp")
    try:
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"cannot mount a tmpfs here ({made.stderr.strip()}): needs CAP_SYS_ADMIN"
        subprocess.run(["umount", probe], check=False)
        return None
    finally:
        os.rmdir(probe)


def test_two_minutes_of_faults_lose_no_acknowledged_write(tmp_path):
    if os.environ.get("MEMCTL_TEST_DATABASE_URL"):
        pytest.skip("the soak kills, fills and restarts the embedded server; with MEMCTL_TEST_DATABASE_URL "
                    "the suite is about that server, which the soak does not use")
    why = _can_mount()
    if why:
        pytest.skip(why)
    figures = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(SOAK), "--minutes", "2", "--json", str(figures)],
                         capture_output=True, text=True, timeout=1200)
    assert figures.exists(), run.stdout + run.stderr
    result = json.loads(figures.read_text())
    report = run.stdout[-4000:]
    assert result["writes_acknowledged"] > 0, report
    assert result["writes_lost"] == 0 and result["duplicated"] == 0, report
    assert {k for k, n in result["faults_by_kind"].items() if n > 0} == FAULT_KINDS, report
    assert result["half_written_imports"] == 0 and result["tracebacks"] == 0, report
    assert result["orphaned_chunks"] == 0 and result["episodes_without_chunks"] == 0, report
    assert result["chunks_unsettled"] == 0 and result["lineage_errors"] == 0, report
    assert result["restart_clean"], report
    assert all(f["recovery_s"] is not None for f in result["recovery_s"]), report
    assert run.returncode == 0 and result["passed"], report
