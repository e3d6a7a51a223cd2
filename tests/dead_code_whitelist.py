"""Names vulture cannot see used (tests/test_dead_code.py): each is read by a library, a protocol or a test.

Vulture's whitelist format: a bare name marks a function, class or variable used; `_.name` an attribute.
Not a test module (pytest collects only test_*.py), and never imported.
"""

# ruff: noqa
# Set for psycopg, tarfile and the server-side cursor, which read them.
_.isolation_level  # memctl/backup/backup.py
_.mtime  # memctl/backup/backup_file.py
_.itersize  # memctl/records/redact_scan.py, memctl/transfer/export.py
# Python's protocols: a module's __getattr__, a signal handler's and __exit__'s arguments, the MCP SDK's
# TokenVerifier.verify_token.
__getattr__  # memctl/cli/__init__.py
frame  # memctl/cli/embed.py
tb  # memctl/overlap.py
_.verify_token  # memctl/mcp/http.py
# dict's own method, refused by a read-only mapping an admitted record holds (a caller's popitem reaches it).
popitem  # memctl/write/admission.py
# Read by uvicorn's Server.run loop: set to stop it (memctl/mcp/http.py, when the schema changed under it).
_.should_exit  # memctl/mcp/http.py
# Fields of results that are rendered whole (dataclasses.asdict, the MCP tool's output schema), never read by name.
redacted_kinds  # memctl/mcp/protocol.py
relevance  # memctl/reading/fusion.py
importance_term
vector_rank
history_values_cleared  # memctl/records/redact_scan.py
runbook_runs  # memctl/records/redact_scan.py, memctl/transfer/export.py, memctl/transfer/import_.py
blocked_sources  # memctl/transfer/export.py, memctl/transfer/import_.py
summary_sources
fact_changes  # memctl/transfer/import_.py
chunks_remade
agent_roles_made  # memctl/transfer/import_.py
nodes  # memctl/cli/size.py: a section's name, chosen by --only
# Import's handlers, found by the record's type (getattr(self, f"_{kind}")).
_._header  # memctl/transfer/import_.py
_._blocked_source
_._fact
_._summary_source
_._runbook_run
# The table of exit codes is whole, 0 included.
EXIT_OK  # memctl/errors.py
# Used by tests and benchmarks only.
assume  # memctl/records/agents.py: tests/bench/agents.py (memctl/mcp/sessions.py runs its own SET ROLE)
repeat_info  # memctl/records/episodes.py: tests/test_repeats.py
_contained  # memctl/redact/keyword.py: tests/test_redact_shapes.py holds it empty
# Never read: the command line's state, which issue 43 moves onto the connection (left to that change).
quiet  # memctl/cli/common.py
# Settings read by name: the recall templates' lines ([recall] <item>_line, memctl/recall/form.py).
fact_line  # memctl/schema.py
episode_line
runbook_line
window_line
# The schema's reference (docs/configuration.md's block), printed by tests/test_docs.py and tests/test_settings.py.
reference  # memctl/config.py
# The way back from Memory.as_agent, for a tool or a test that runs a while as an agent on one handle (the MCP
# server opens a new handle instead): tests/test_agents.py, tests/test_upgrade_guard.py.
_.as_owner  # memctl/db/memory.py
