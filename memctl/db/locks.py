"""The advisory locks that order memctl's writes against the changes that must see all of them.

The embedding-model registry: a registration takes LOCK (exclusive); every write that queues chunks takes
WRITE_LOCK (shared) before it reads the model list, so a registration waits for writes in flight and its
queueing sees their chunks, and a write that starts later sees the new model.

The blocked sources: `memctl source block` takes BLOCK_LOCK (exclusive) for its insert; every write that
admitted a source takes SOURCES_LOCK (shared) at its end, then looks at blocked_sources again before it
commits (memctl.write.gate, Gate.writing). A block therefore waits only for the commits of writes already
confirmed, and a write still running when a block commits sees it and is refused whole: an import that
began before its source was blocked does not land its records after the purge.

Order: a transaction that takes both takes WRITE_LOCK first (a block never waits on the registry).
"""

LOCK = "SELECT pg_advisory_xact_lock(hashtext('memctl.embedding_models'))"
WRITE_LOCK = "SELECT pg_advisory_xact_lock_shared(hashtext('memctl.embedding_models'))"

BLOCK_LOCK = "SELECT pg_advisory_xact_lock(hashtext('memctl.blocked_sources'))"
SOURCES_LOCK = "SELECT pg_advisory_xact_lock_shared(hashtext('memctl.blocked_sources'))"
