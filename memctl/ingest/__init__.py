"""`memctl ingest`: a log stream into episodes as it arrives, and the log formats it reads.

May import the base modules, memctl.db, memctl.write and memctl.records.
"""
