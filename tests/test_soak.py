"""The soak's short profile, in both topologies: a minute each of writes, embedding, search and upkeep under
every kind of fault (two minutes in all, as the one topology's profile took before).

tests/bench/soak.py runs the installed memctl against an embedded server on a tmpfs it mounts, started on
demand (standard) or owned by `memctl db serve` under a supervisor loop that restarts it after kill -9
(managed), and checks what the database holds against what each command acknowledged; see its docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).with_name("bench") / "soak.py"
FAULT_KINDS = {
    "standard": {
        "kill_embed_worker",
        "kill_import",
        "ollama_restart",
        "kill_postmaster",
        "disk_full",
    },
    "managed": {"kill_embed_worker", "kill_import", "ollama_restart", "kill_serve", "disk_full"},
}
WRITES = {"episode", "import", "fact"}
# A minute with the five faults 9 s apart (the first at 5 s, none in the last 10 s), a full disk or Ollama down 4 s.
SHORT = ["--minutes", "1", "--warmup", "5", "--margin", "10", "--fault-every", "9", "--hold", "4"]


def _can_mount() -> str | None:
    """Why a size-limited filesystem cannot be mounted here, or None."""
    if os.geteuid() != 0:
        return "needs root to mount a size-limited tmpfs for the data directory"
    import tempfile

    probe = tempfile.mkdtemp(prefix="memctl-soak-probe-", dir="/var/tmp")
    try:
        made = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            return f"cannot mount a tmpfs here ({made.stderr.strip()}): needs CAP_SYS_ADMIN"
        subprocess.run(["umount", probe], check=False)
        return None
    finally:
        os.rmdir(probe)


@pytest.mark.parametrize("topology", ["standard", "managed"])
def test_a_minute_of_faults_loses_no_acknowledged_write(tmp_path, topology):
    if os.environ.get("MEMCTL_TEST_DATABASE_URL"):
        pytest.skip(
            "the soak kills, fills and restarts the embedded server; with MEMCTL_TEST_DATABASE_URL "
            "the suite is about that server, which the soak does not use"
        )
    why = _can_mount()
    if why:
        pytest.skip(why)
    figures = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(SOAK), "--topology", topology, *SHORT, "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert figures.exists(), run.stdout + run.stderr
    result = json.loads(figures.read_text())
    report = run.stdout[-4000:]
    assert result["topology"] == topology, report
    acked = result["acknowledged_by_kind"]
    assert set(acked) == WRITES and all(acked[kind] > 0 for kind in WRITES), (
        report
    )  # every kind of write, each
    assert result["unexpected_exits"] == [] and result["unexpected_exit_count"] == 0, report
    assert result["writes_lost"] == 0 and result["duplicated"] == 0, report
    assert {k for k, n in result["faults_by_kind"].items() if n > 0} == FAULT_KINDS[topology], (
        report
    )
    if topology == "managed":
        assert result["serve_starts"] >= 3, report  # the first, after kill -9, after the clean stop
    assert result["half_written_imports"] == 0 and result["tracebacks"] == 0, report
    assert result["orphaned_chunks"] == 0 and result["episodes_without_chunks"] == 0, report
    assert result["chunks_unsettled"] == 0 and result["lineage_errors"] == 0, report
    assert result["restart_clean"], report
    assert all(f["recovery_s"] is not None for f in result["recovery_s"]), report
    assert run.returncode == 0 and result["passed"], report
