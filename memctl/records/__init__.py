"""Memory records: episodes, facts, agents, access tracking, the job log, summary lineage, the erasure ledger,
the episode log's filters, and the scan for secrets already stored (`memctl redact scan`).

May import the base modules (memctl, errors, config, files, jsonl, redact, model_catalogue), memctl.db and
memctl.write (the write path every record passes).
"""
