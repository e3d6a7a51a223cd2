"""memctl: agent memory on PostgreSQL + pgvector: facts, episodes, runbooks."""

__version__ = "0.2.0"
