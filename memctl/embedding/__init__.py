"""Embedding: the embedder protocol (protocol), Ollama (ollama), the local all-MiniLM-L6-v2
network (local, minilm), the hash embedder and the factory (embedders), the model registry, the
embed worker, timing and the footprint of a model's vectors.

May import the base modules, memctl.db, memctl.write and memctl.records.
"""
