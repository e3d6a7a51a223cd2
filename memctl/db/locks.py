"""The locks that order memctl's writes against the changes that must see all of them.

The embedding-model registry: a registration takes LOCK (exclusive); every write that queues chunks takes
WRITE_LOCK (shared) before it reads the model list, so a registration waits for writes in flight and its
queueing sees their chunks, and a write that starts later sees the new model.

The blocked sources: `memctl source block` takes BLOCK_LOCK (exclusive) for its insert; every write that
admitted a source takes SOURCES_LOCK (shared) at its end, then looks at blocked_sources again before it
commits (memctl.write.gate, Gate.writing). A block therefore waits only for the commits of writes already
confirmed, and a write still running when a block commits sees it and is refused whole: an import that
began before its source was blocked does not land its records after the purge.

Order: a transaction that takes both takes WRITE_LOCK first (a block never waits on the registry).

These, and the keyed locks of one agent's repeats (memctl.write.repeats) and of one fact's key
(memctl.records.facts), are held to the end of the transaction and taken through memctl_lock and
memctl_lock_key (sql/0023): locks on tables that only memctl's owner may lock. They were advisory locks,
which any session of the database may take: an agent's own session could have held one against the
owner's writes, or another agent's. The functions refuse a session that is not memctl's (an agent's own
login), which writes nothing anyway.

Session locks (a migration, a summary's window, a model's re-embedding) span transactions and stay advisory
where memctl's role may not revoke advisory locks from PUBLIC (memctl.db.wall.harden does where it may):
whoever holds one is named (holder()), and a lock held by a session that is not memctl's is refused with
that name rather than waited for.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from memctl.errors import MemctlError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

LOCK = "SELECT memctl_lock('models', false)"
WRITE_LOCK = "SELECT memctl_lock('models', true)"

BLOCK_LOCK = "SELECT memctl_lock('sources', false)"
SOURCES_LOCK = "SELECT memctl_lock('sources', true)"

# One key of a space: (space, name), exclusive, to the end of the transaction.
KEY_LOCK = "SELECT memctl_lock_key(%s, %s)"

# The session holding an advisory lock: by its bigint key, or by two int4 keys, the second given or hashtext(name);
# `ours` when the session's user has memctl's role's privileges (another memctl process), not when it is an agent's.
HOLDER = """
SELECT a.pid, a.usename AS role, coalesce(pg_has_role(a.usename, current_user, 'USAGE'), false) AS ours
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = %(hi)s::oid AND l.objsubid = %(sub)s
  AND l.objid = (coalesce(%(lo)s::int8, hashtext(%(name)s)::int8) & 4294967295)::oid
LIMIT 1
"""
TRY_SESSION_LOCK = "SELECT pg_try_advisory_lock(%s) AS ok"
WAIT_S = 0.2


def holder(
    conn: Memory, key: int, second: int | None = None, *, name: str | None = None
) -> dict | None:
    """Who holds an advisory lock: key alone (a bigint), or two int4 keys (key, second or hashtext(name))."""
    if second is None and name is None:
        params: dict[str, int | str | None] = {
            "hi": (key >> 32) & 0xFFFFFFFF,
            "lo": key & 0xFFFFFFFF,
            "name": None,
            "sub": 1,
        }
    else:
        params = {"hi": key & 0xFFFFFFFF, "lo": second, "name": name, "sub": 2}
    return conn.execute(HOLDER, params).fetchone()


def foreign(found: dict | None, what: str) -> MemctlError | None:
    """The error for a lock held by a session that is not memctl's (an agent's own login), or None."""
    if found is None or found["ours"]:
        return None
    return MemctlError(
        f"{what}: memctl's lock is held by a session of role {found['role']} (pid {found['pid']}), "
        f"not memctl's: `memctl agent revoke` ends an agent's sessions, or a DBA runs "
        f"SELECT pg_terminate_backend({found['pid']})"
    )


def session_lock(conn: Memory, key: int, what: str) -> None:
    """pg_advisory_lock(key), waiting for memctl's other processes but never for a session that is not memctl's."""
    while not conn.one(TRY_SESSION_LOCK, (key,))["ok"]:
        refused = foreign(holder(conn, key), what)
        if refused is not None:
            raise refused
        time.sleep(WAIT_S)
