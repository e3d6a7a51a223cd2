"""A backup file (memctl.backup.backup): its layout, written whole, and read back checked.

An uncompressed tar of exactly three members, in this order:

    manifest.json   what the backup holds (memctl.backup.backup describes its fields)
    memctl.dump     pg_dump's custom format (compressed by pg_dump)
    SHA256SUMS      sha256 of the two above, as `sha256sum` writes them (`sha256sum -c` checks an extract)

Reading checks every byte: the tar headers (their own checksums), the two members against SHA256SUMS
(the manifest when it is read, the dump as it is copied out), the padding and the tar's end (zeros,
nothing after them). A file that fails any of these is refused as damaged.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path
from typing import IO, Any

from memctl import __version__
from memctl.errors import DiskFull, InvalidInput, NotFound, no_space

FORMAT = "memctl-backup"
VERSION = 1
MANIFEST = "manifest.json"
DUMP = "memctl.dump"
SUMS = "SHA256SUMS"
MEMBERS = [MANIFEST, DUMP, SUMS]
MAX_SMALL = 16 * 2**20  # the manifest and SHA256SUMS are read into memory: at most this
BLOCK = tarfile.BLOCKSIZE
_SUM_LINE = re.compile(r"^([0-9a-f]{64})  (\S+)$")


def write(handle: IO[bytes], manifest: dict, dump: Path) -> None:
    """The three members into HANDLE (the caller makes it whole: memctl.files.atomic_write)."""
    data = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")
    sums = f"{hashlib.sha256(data).hexdigest()}  {MANIFEST}\n{manifest['dump']['sha256']}  {DUMP}\n".encode()
    now = int(time.time())
    with tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, size, source in (
            (MANIFEST, len(data), io.BytesIO(data)),
            (DUMP, dump.stat().st_size, None),
            (SUMS, len(sums), io.BytesIO(sums)),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = size, 0o600, now
            if source is None:
                with open(dump, "rb") as source_file:
                    tar.addfile(info, source_file)
            else:
                tar.addfile(info, source)


def _contents(tar: tarfile.TarFile, member: tarfile.TarInfo | str) -> IO[bytes]:
    """A member's contents; it is a regular file (the layout is checked before: the others have none)."""
    contents = tar.extractfile(member)
    assert contents is not None
    return contents


def damaged(path: Path, why: str) -> InvalidInput:
    return InvalidInput(f"{path}: damaged backup: {why}")


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a backup file, checked against SHA256SUMS and for shape, the file's layout checked."""
    path, first = Path(path), None
    try:
        with tarfile.open(path, "r:") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST:
                raise InvalidInput(
                    f"{path}: not a memctl backup (its first member is not {MANIFEST})"
                )
            members = tar.getmembers()  # headers only: the dump's data is skipped
            names = [m.name for m in members]
            if names != MEMBERS or not all(m.isfile() for m in members):
                raise damaged(
                    path,
                    f"it holds {', '.join(names)} instead of {', '.join(MEMBERS)} (cut short?)",
                )
            if members[0].size > MAX_SMALL or members[2].size > MAX_SMALL:
                raise damaged(path, f"{MANIFEST} or {SUMS} is too large")
            data, sums = (_contents(tar, m).read() for m in (members[0], members[2]))
        _check_layout(path, members)
    except FileNotFoundError:
        raise NotFound(f"no backup file {path}") from None
    except (tarfile.TarError, OSError) as exc:
        if first is not None:
            raise damaged(path, str(exc)) from None
        raise InvalidInput(f"{path}: not a memctl backup, or damaged ({exc})") from None
    listed = _sums(path, sums)
    if hashlib.sha256(data).hexdigest() != listed.get(MANIFEST):
        raise damaged(path, f"{MANIFEST} differs from its sha256 in {SUMS}")
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise damaged(path, f"{MANIFEST} is not JSON ({exc})") from None
    _check_manifest(path, manifest)
    if manifest["dump"]["sha256"] != listed.get(DUMP):
        raise damaged(path, f"the dump's sha256 in {MANIFEST} differs from the one in {SUMS}")
    return manifest


def _sums(path: Path, text: bytes) -> dict[str, str]:
    found = {}
    for line in text.decode("ascii", "replace").splitlines():
        match = _SUM_LINE.match(line)
        if match is None:
            raise damaged(path, f"{SUMS} has a line that is not a checksum")
        found[match.group(2)] = match.group(1)
    return found


def _check_layout(path: Path, members: list[tarfile.TarInfo]) -> None:
    """Every byte is a header, a member's data, or zeros: the padding after each member and the tar's end."""
    with open(path, "rb") as handle:
        size, position = os.fstat(handle.fileno()).st_size, 0
        for member in members:
            if member.offset != position:
                raise damaged(path, f"unexpected bytes before {member.name}")
            end = member.offset_data + member.size
            position = member.offset_data + -(-member.size // BLOCK) * BLOCK
            handle.seek(end)
            if handle.read(position - end).strip(b"\0"):
                raise damaged(path, f"the padding after {member.name} is not zeros")
        if not 2 * BLOCK <= size - position <= tarfile.RECORDSIZE + 2 * BLOCK:
            raise damaged(path, "the tar's end is missing, or bytes follow it")
        handle.seek(position)
        if handle.read().strip(b"\0"):
            raise damaged(path, "bytes follow the tar's last member")


def _check_manifest(path: Path, manifest: Any) -> None:
    def bad(what: str) -> InvalidInput:
        return InvalidInput(f"{path}: the manifest is not a memctl backup's ({what})")

    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise bad("format")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise InvalidInput(
            f"{path}: backup format version {manifest.get('version')!r}; this memctl "
            f"({__version__}) reads up to {VERSION}: restore it with a newer memctl"
        )
    dump, tables, server = manifest.get("dump"), manifest.get("tables"), manifest.get("server")
    if not (
        isinstance(dump, dict)
        and isinstance(dump.get("bytes"), int)
        and re.fullmatch(r"[0-9a-f]{64}", str(dump.get("sha256")))
    ):
        raise bad("dump")
    if not (
        isinstance(server, dict)
        and isinstance(server.get("schema"), str)
        and isinstance(manifest.get("pg_dump"), dict)
        and isinstance(manifest["pg_dump"].get("major"), int)
    ):
        raise bad("server")
    if not isinstance(tables, dict) or not all(
        isinstance(t, dict)
        and isinstance(t.get("rows"), int)
        and isinstance(t.get("checksum"), str)
        and isinstance(t.get("columns"), list)
        and t["columns"]
        and all(isinstance(c, str) for c in t["columns"])
        for t in tables.values()
    ):
        raise bad("tables")
    if not isinstance(manifest.get("records"), dict) or not isinstance(
        manifest.get("created_at"), str
    ):
        raise bad("records")


def extract_dump(path: str | Path, manifest: dict, directory: Path) -> Path:
    """Copy the backup's dump into DIRECTORY (0600), checking its size and sha256 against the manifest."""
    path, target = Path(path), directory / DUMP
    digest, size = hashlib.sha256(), 0
    try:
        with tarfile.open(path, "r:") as tar:
            source = _contents(tar, tar.getmember(DUMP))
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                for block in iter(lambda: source.read(1 << 20), b""):
                    digest.update(block)
                    size += len(block)
                    out.write(block)
    except (tarfile.TarError, OSError, KeyError) as exc:
        if no_space(exc):
            raise DiskFull.at(directory, f"cannot copy the dump out of {path.name}") from None
        raise damaged(path, str(exc)) from None
    expected = manifest["dump"]
    if size != expected["bytes"] or digest.hexdigest() != expected["sha256"]:
        raise damaged(
            path,
            f"{DUMP} has {size} bytes, sha256 {digest.hexdigest()[:16]}..., the manifest says "
            f"{expected['bytes']} bytes, sha256 {expected['sha256'][:16]}...",
        )
    return target
