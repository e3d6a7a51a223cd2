"""Memory records: the write gate and its writers, episodes, facts, runbooks (procedural memory), chunking,
sources, access tracking, the job log and summary lineage.

May import the base modules (memctl, errors, config, files, jsonl, redact, model_catalogue) and memctl.db.
"""
