"""Upkeep: retention (policy, prune, purge, and the batched deletion they share), summaries (the chat
client and the windows), the redaction scan, size, export and import, re-embedding, systemd units, status.

May import every layer below: the base modules, memctl.db, memctl.records, memctl.embedding, memctl.reading.
"""
