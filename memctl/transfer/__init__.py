"""Transfer: the whole memory as one JSONL stream (`memctl export`) and back (`memctl import`).

May import the base modules, memctl.db, memctl.write, memctl.records and memctl.embedding.
"""
