"""The CI scripts' check of a data directory's postmaster.pid (tests/ci/server-pid.sh).

A server killed without a shutdown leaves postmaster.pid behind; after a restart its PID may belong
to another process. The check must call the server running only when that PID is a process working
in the data directory, and clear the lock files otherwise.
"""

import subprocess
from pathlib import Path

HELPER = Path(__file__).parent / "ci" / "server-pid.sh"


def _bash(script, *args):
    return subprocess.run(
        ["bash", "-c", f'. "{HELPER}"; {script}', "bash", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _pid_file(data, pid):
    (data / "postmaster.pid").write_text(f"{pid}\n{data}\n1700000000\n55443\n")


def test_a_live_pid_of_another_process_is_stale(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    other = subprocess.Popen(["sleep", "30"], cwd=tmp_path)  # alive, same user, elsewhere
    try:
        _pid_file(data, other.pid)
        (run / ".s.PGSQL.55443.lock").write_text(f"{other.pid}\n")
        assert _bash('server_running "$1"', data).returncode == 1
        cleared = _bash('clear_stale_pid "$1" "$2" 55443', data, run)
        assert cleared.returncode == 0
        assert f"PID {other.pid} is not it" in cleared.stderr
        assert not (data / "postmaster.pid").exists()
        assert not (run / ".s.PGSQL.55443.lock").exists()
    finally:
        other.kill()
        other.wait()


def test_a_process_in_the_data_directory_is_running(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    server = subprocess.Popen(["sleep", "30"], cwd=data)  # what a postmaster looks like from /proc
    try:
        _pid_file(data, server.pid)
        (run / ".s.PGSQL.55443.lock").write_text(f"{server.pid}\n")
        assert _bash('server_running "$1"', data).returncode == 0
        assert _bash('clear_stale_pid "$1" "$2" 55443', data, run).returncode == 0
        assert (data / "postmaster.pid").exists()
        assert (run / ".s.PGSQL.55443.lock").exists()
    finally:
        server.kill()
        server.wait()


def test_a_dead_pid_and_no_file(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    assert _bash('server_running "$1"', data).returncode == 1  # no file: not running
    assert _bash('clear_stale_pid "$1" "$2" 55443', data, run).returncode == 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    _pid_file(data, gone.pid)
    assert _bash('clear_stale_pid "$1" "$2" 55443', data, run).returncode == 0
    assert not (data / "postmaster.pid").exists()
