"""Retention: the policy, prune, purge, the batched deletion they share, and summaries (old episodes rolled
up before retention forgets them) with the chat model that writes them.

May import the layers below it: the base modules, memctl.db, memctl.write, memctl.records, memctl.embedding,
memctl.reading and memctl.backup.
"""
