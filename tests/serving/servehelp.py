"""Helpers of the serving tests: prompts, Valkey command counts, logprob comparison."""

from __future__ import annotations

import random
import time
from typing import Any, Callable

PREFIX = 4096      # tokens: 16 LMCache chunks of 256
CHUNK = 256


def prompt(seed: int, n: int = PREFIX, *, vocab: int = 400) -> list[int]:
    """A deterministic prefix of ``n`` token ids (ids 3..vocab, past the special tokens)."""
    rnd = random.Random(seed)
    return [rnd.randrange(3, vocab) for _ in range(n)]


QUESTION_1 = [11, 12, 13, 14, 15]
QUESTION_2 = [21, 22, 23, 24, 25, 26, 27]


def calls(valkey: Any, command: str) -> int:
    """How many times the server ran ``command`` (INFO commandstats)."""
    info = valkey.cmd("INFO", "commandstats").decode()
    for line in info.splitlines():
        if line.startswith(f"cmdstat_{command.lower()}:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


def clients(valkey: Any) -> int:
    """Connected clients, counting the one asking."""
    info = valkey.cmd("INFO", "clients").decode()
    return int(info.split("connected_clients:", 1)[1].split()[0])


def same_answer(got: Any, want: Any, atol: float = 0.02) -> str | None:
    """None when both completions chose the same top-5 tokens with logprobs within ``atol``;
    else what differs. (A wrong KV cache moves logprobs by whole units, not hundredths.)"""
    if got.status != 200 or want.status != 200:
        return f"status {got.status} vs {want.status}: {got.body if got.status != 200 else want.body}"
    if set(got.top) != set(want.top):
        return f"top-5 tokens {sorted(got.top)} vs {sorted(want.top)}"
    worst = max(abs(got.top[t] - want.top[t]) for t in want.top)
    return None if worst <= atol else f"logprobs differ by {worst:.4f}: {got.top} vs {want.top}"


def wait_for(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> None:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if cond():
            return
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g}s")


def settle(valkey: Any, timeout: float = 30.0) -> int:
    """Wait until the key count stops moving (stores are asynchronous); returns it."""
    last, stable_since = -1, time.monotonic()
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        n = int(valkey.cmd("DBSIZE"))
        if n != last:
            last, stable_since = n, time.monotonic()
        elif time.monotonic() - stable_since > 1.5:
            return n
        time.sleep(0.25)
    return last
