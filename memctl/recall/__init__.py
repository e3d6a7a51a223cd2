"""Recall: one context block for an agent (facts, runbooks and episodes) fitted to a budget, and its windows.

May import the base modules, memctl.db, memctl.write, memctl.records, memctl.runbooks, memctl.embedding and
memctl.reading.
"""
