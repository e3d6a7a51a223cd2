"""Fixtures of the re-embedding tests, each module with its own Ollama-protocol test server (its `server` fixture:
the models a change goes from and to). Loaded through pytest_plugins (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def server_env(server, memctl_env, monkeypatch):
    """memctl on the test module's own `server` through the real ollama client, all-minilm active: the environment
    (also set in this process)."""
    values = {
        "MEMCTL_EMBEDDER": "ollama",
        "MEMCTL_EMBED_MODEL": "all-minilm",
        "OLLAMA_HOST": server.url,
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return {**memctl_env, **values}
