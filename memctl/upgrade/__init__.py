"""Upgrades of a memory that must lose nothing: a migration's plan, a verified backup before it, pgvector
brought up to the server's, and the embedded server's PostgreSQL major moved with pg_upgrade.

May import every layer below memctl.retention: the base modules, memctl.db, memctl.write, memctl.records,
memctl.embedding, memctl.reading, memctl.backup.
"""
