"""The embedding-model registry's advisory lock: registering a model excludes writes that queue chunks.

A registration takes LOCK (exclusive); every write that queues chunks takes WRITE_LOCK (shared) before it
reads the model list, so a registration waits for writes in flight and its queueing sees their chunks,
and a write that starts later sees the new model.
"""

LOCK = "SELECT pg_advisory_xact_lock(hashtext('memctl.embedding_models'))"
WRITE_LOCK = "SELECT pg_advisory_xact_lock_shared(hashtext('memctl.embedding_models'))"
