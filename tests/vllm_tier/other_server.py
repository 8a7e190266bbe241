"""A second vLLM server's scheduler in its own process (for test_vllm_two_servers.py).

    python other_server.py URL offload|fetch SEED N

``offload`` stores N blocks of prompt SEED through the real tiering manager; ``fetch``
loads them and prints one JSON line: the sha256 of each block it got.
"""

from __future__ import annotations

import hashlib
import json
import sys

from vllmhelp import Engine, keys


def main() -> None:
    url, mode, seed, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    engine = Engine(url)
    try:
        ks = keys(seed, n)
        if mode == "offload":
            engine.offload(ks)
            print(json.dumps({"stored": n}))
        else:
            print(json.dumps({"digests": [hashlib.sha256(b).hexdigest() for b in engine.fetch(ks)]}))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
