"""Observation: what state memory is in (status), what it costs on disk (size), and both as Prometheus
metrics.

May import every layer below it, memctl.retention included (status reports the summaries' backlog).
"""
