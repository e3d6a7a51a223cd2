"""all-MiniLM-L6-v2 for the Ollama test server, in a Python that has memctl[local].

The production test environment has no torch (that is the point of it), so the test server
(tests/ollama_server.py) runs this script with the Python named in MEMCTL_TEST_MINILM_PYTHON
and asks it for vectors. It speaks JSON lines:

    stdin:  {"texts": ["...", ...]}                one request per line
    stdout: {"vectors": [[...384 floats], ...]}    one answer per line, in order
            {"error": "..."}                       when the request cannot be embedded

It ends at EOF on stdin. The vectors are memctl's LocalEmbedder's, unrounded (JSON keeps a
float's repr exactly), so they are the same as the in-process ones.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    protocol, sys.stdout = (
        sys.stdout,
        sys.stderr,
    )  # nothing a library prints can corrupt the answers
    from memctl.embedding.local import LocalEmbedder

    embedder = LocalEmbedder()
    for line in sys.stdin:
        try:
            texts = json.loads(line)["texts"]
            answer = {"vectors": embedder.embed(texts).vectors}
        except Exception as exc:  # reported to the server, which fails the request visibly
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
