"""Reading memory: query syntax, the one search statement, BM25 and fusion, recall and stale-fact checks.

May import the base modules, memctl.db, memctl.records and memctl.embedding.
"""
