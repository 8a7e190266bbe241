"""A second SGLang server's storage side in its own process (for test_sglang_two_servers.py).

    python other_server.py URL store|load SEED N LAYOUT

``store`` fills N pages of its own host pool from SEED and writes them through the backend
(zero-copy API); ``load`` reads N pages of keys SEED into its pool and prints one JSON line:
the sha256 of each page's bytes, or null for a miss.
"""

from __future__ import annotations

import hashlib
import json
import sys

from sglanghelp import fill_pages, indices, keys, make_backend, make_pool, page_bytes


def main() -> None:
    url, mode, seed, n, layout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    pool = make_pool("mha", layout)
    backend = make_backend(url, pool=pool)
    try:
        ks = keys(n, seed)
        starts = [4 * i for i in range(n)]
        if mode == "store":
            fill_pages(pool, starts, seed=sum(map(ord, seed)))
            print(json.dumps({"stored": sum(backend.batch_set_v1(ks, indices(pool, starts)))}))
        else:
            ok = backend.batch_get_v1(ks, indices(pool, starts))
            print(json.dumps({"digests": [hashlib.sha256(page_bytes(pool, s)).hexdigest() if o else None
                                          for s, o in zip(starts, ok)]}))
    finally:
        backend.close()


if __name__ == "__main__":
    main()
