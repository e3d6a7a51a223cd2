"""Runbooks (procedural memory): Markdown files in a git repository, their format, and their runs.

May import the base modules, memctl.db, memctl.write and memctl.records.
"""
