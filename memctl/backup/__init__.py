"""Backups and restores of the whole database, and erasures kept true across them (receipt, verify,
re-application after a restore).

May import every layer below memctl.retention: the base modules, memctl.db, memctl.write, memctl.records,
memctl.embedding, memctl.reading.
"""
