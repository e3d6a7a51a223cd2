"""A full disk for a test: a size-limited tmpfs (root only; skips, saying why, elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 1 MiB tmpfs; `fill()` writes a file until no byte is left. Unmounted afterwards."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a size-limited tmpfs")
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield Disk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


class Disk:
    def __init__(self, path):
        self.path = path

    def fill(self) -> None:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={self.path}/filler", "bs=64k"], capture_output=True
        )
