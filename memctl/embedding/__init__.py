"""Embedding: the embedders (Ollama, the local all-MiniLM-L6-v2 network, hash), the chat client (the
summaries' model), the model registry, the embed worker, timing and the footprint of a model's vectors.

May import the base modules, memctl.db, memctl.write and memctl.records.
"""
