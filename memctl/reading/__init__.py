"""Reading memory: query syntax, the one search statement, the HNSW scan, BM25 and fusion, and
stale-fact checks.

May import the base modules, memctl.db, memctl.write, memctl.records and memctl.embedding.
"""
