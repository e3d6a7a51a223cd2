"""`memctl ingest`: a log stream into episodes as it arrives (ingest), the input it reads and the
run over it (stream), and the log formats (logformats).

May import the base modules, memctl.db, memctl.write and memctl.records.
"""
