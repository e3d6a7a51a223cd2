"""The write path: every record that enters memory passes here.

The checks every field passes (values), the one gate (gate: validated, source checked, redacted) and the
records it seals (admission), chunking, repeats folded, a record stored once (identity), blocked sources,
and the writers (store), the only statements that insert into a memory table.

May import the base modules (memctl, errors, config, files, jsonl, redact, model_catalogue) and memctl.db.
"""
