"""Skips in CI (tests/fix_ci.py): each step is recognised from its environment, and with CI set a skip the step does
not expect fails, giving its reason, whether a test skips itself, a marker skips it or a module skips whole; the
expected skip stays a skip, and outside CI every skip does. Each case runs pytest on a small file of its own with
only fix_ci's hooks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fix_ci

ROOT = Path(__file__).resolve().parent.parent
SKIPS = """
import pytest

def test_expected():
    pytest.skip("needs a Citus cluster: set MEMCTL_TEST_CITUS_URL to its coordinator")

def test_unexpected():
    pytest.skip("promtool is not installed")

@pytest.mark.skipif(True, reason="a marker's reason")
def test_marked():
    pass

def test_runs():
    assert True
"""
MODULE_SKIP = 'import pytest\npytest.skip("no numpy here", allow_module_level=True)\n'
STEP_1 = {"CI": "1", "MEMCTL_TEST_PROFILE": "production"}


def run_pytest(
    tmp_path: Path, files: dict[str, str], env: dict[str, str]
) -> subprocess.CompletedProcess:
    tmp_path = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    tmp_path.mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    environ = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("CI", "MEMCTL_TEST_PROFILE", "MEMCTL_TEST_CITUS_URL", "MEMCTL_TEST_DATABASE_URL")
    }
    environ.update(env, PYTHONPATH=str(ROOT))  # tests.fix_ci only: it imports nothing of memctl
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.fix_ci",
            "-rA",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=environ,
    )


@pytest.mark.parametrize(
    "env, number",
    [
        ({}, None),
        ({"CI": ""}, None),
        ({"CI": "1"}, 2),
        ({"CI": "true", "MEMCTL_TEST_PROFILE": "production"}, 1),
        ({**STEP_1, "MEMCTL_TEST_DATABASE_URL": "x", "MEMCTL_TEST_SERVER_ONLY": "1"}, 3),
        ({**STEP_1, "MEMCTL_TEST_CITUS_URL": "x"}, 4),
    ],
)
def test_the_step_is_recognised_from_the_environment(env, number):
    found = fix_ci.step_of(env)
    assert (found.number if found else None) == number


def test_with_ci_an_unexpected_skip_fails_with_its_reason_and_an_expected_one_stays_a_skip(
    tmp_path,
):
    done = run_pytest(tmp_path, {"test_skips.py": SKIPS}, STEP_1)
    assert done.returncode == 1, done.stdout
    assert (
        "FAILED test_skips.py::test_unexpected" in done.stdout
    )  # a marker's skip is in setup: an error there
    assert "ERROR test_skips.py::test_marked" in done.stdout
    assert "does not expect this skip (tests/fix_ci.py): promtool is not installed" in done.stdout
    assert "does not expect this skip (tests/fix_ci.py): a marker's reason" in done.stdout
    assert "SKIPPED [1] test_skips.py:5: needs a Citus cluster" in done.stdout
    assert (
        "PASSED test_skips.py::test_runs" in done.stdout
        and "1 failed, 1 passed, 1 skipped, 1 error" in done.stdout
    )
    assert "    1 skipped as expected: ^needs a Citus cluster" in done.stdout


def test_with_ci_a_module_skipped_whole_fails_its_collection(tmp_path):
    done = run_pytest(tmp_path, {"test_whole.py": MODULE_SKIP}, STEP_1)
    assert done.returncode == 2 and "ERROR test_whole.py" in done.stdout, done.stdout
    assert "does not expect this skip (tests/fix_ci.py): no numpy here" in done.stdout


def test_outside_ci_and_in_a_step_that_expects_none_the_skips_are_judged_as_declared(tmp_path):
    outside = run_pytest(tmp_path, {"test_skips.py": SKIPS, "test_whole.py": MODULE_SKIP}, {})
    assert outside.returncode == 0 and "1 passed, 4 skipped" in outside.stdout, outside.stdout
    step_4 = run_pytest(
        tmp_path, {"test_skips.py": SKIPS}, {"CI": "1", "MEMCTL_TEST_CITUS_URL": "x"}
    )
    assert step_4.returncode == 1 and "2 failed, 1 passed, 1 error" in step_4.stdout, step_4.stdout
    assert "skipped in CI step 4" in step_4.stdout and "no skip expected, none met" in step_4.stdout


def test_ci_runs_the_block_with_ci_exported():
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    exported = script.index("export CI=1")
    assert exported < next(i for i, line in enumerate(script) if '-c "$block"' in line)
