"""A hostile tenant against a real ``lmcache-valkey tierd`` (its own process, as the chart runs it).

Tenant t1's workers may push anything to t1's request list and write t1's delete-intent
hash. tierd runs with a wider account than theirs, so none of that may make it touch another
tenant's chunks, markers or reply lists (a confused deputy), allocate without bound, or stop
serving. Object keys and NVMe files are built only from checked key segments."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
from tierhelp import NS, chunk

from lmcache_valkey.keys import Namespace
from lmcache_valkey.tiering import protocol

pytestmark = pytest.mark.timeout(240)

T1_REP = protocol.reply_key("lmcv", "t1", "a" * 32)
T2_REP = protocol.reply_key("lmcv", "t2", "b" * 32)
T1_REQ = protocol.request_key("lmcv", "t1")
NS2 = Namespace("lmcv", "t2", NS.digest)
NS10 = Namespace("lmcv", "t10", NS.digest)  # "lmcv:t1" is a prefix of its keys


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


class Tierd:
    """``lmcache-valkey tierd`` for tenant t1 in a subprocess, and a raw view of its lists."""

    def __init__(self, valkey, nvme_dir: str, moto_s3, log_path: Path) -> None:
        self.valkey, self.nvme_dir, self.moto_s3 = valkey, nvme_dir, moto_s3
        exe = Path(sys.executable).with_name("lmcache-valkey")
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [str(exe), "tierd", "--valkey-url", valkey.url, "--tenant", "t1", "--nvme-dir", nvme_dir,
             "--nvme-budget-bytes", "64MiB", "--s3-bucket", moto_s3.bucket, "--s3-endpoint-url", moto_s3.url,
             "--admission", "always", "--set", "request_block_s=0.2", "--set", "demote_interval_s=0.2"],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.ids = iter(range(1, 1 << 30))
        self.stats()  # answers once started

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def push(self, *raws: bytes) -> None:
        self.valkey.cmd("RPUSH", T1_REQ, *raws)

    def ask(self, msg: dict, timeout: float = 60.0) -> dict:
        """Send a request with t1's reply list and wait for its answer."""
        rid = next(self.ids)
        self.push(protocol.pack({"reply": T1_REP, "id": rid, "ttl_ms": 30_000, **msg}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "tierd exited:\n" + self.log()[-3000:]
            r = self.valkey.cmd("BLPOP", T1_REP, 0.5)
            if r is None:
                continue
            reply = msgpack.unpackb(r[1], raw=False)
            if reply["id"] == rid:
                return reply
        raise AssertionError(f"no answer to {msg!r}:\n" + self.log()[-3000:])

    def stats(self) -> dict:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = self.ask({"op": "stats"}, timeout=5.0)
                assert r["ok"], r
                return r["result"]
            except AssertionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture
def tierd(valkey_server, nvme_dir, moto_s3, tmp_path):
    moto_s3.create_bucket()
    t = Tierd(valkey_server, nvme_dir, moto_s3, tmp_path / "tierd.log")
    try:
        yield t
    finally:
        t.close()


def _bucket_keys(moto_s3) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=moto_s3.bucket).get("Contents", [])]


def _chunk_files(nvme_dir: str) -> list[str]:
    return [f for _d, _s, fs in os.walk(nvme_dir) for f in fs if len(f) == 32]


def _victims(valkey) -> dict[bytes, bytes]:
    """Chunks (and tier markers) of tenants t2 and t10 in Valkey RAM, as their own tierds left them."""
    out = {}
    for ns in (NS2, NS10):
        key, value = chunk(7, 4096, ns=ns)
        valkey.cmd("SET", key, value)
        marker = key.replace(b":c:{", b":t:{")
        valkey.cmd("SET", marker, b"n")
        out[key], out[marker] = value, b"n"
    return out


def test_requests_naming_another_tenant_are_refused_and_touch_nothing(valkey_server, tierd, moto_s3, nvme_dir):
    victims = _victims(valkey_server)
    v2 = next(k for k in victims if k.startswith(b"lmcv:t2:") and b":c:{" in k)
    v10 = next(k for k in victims if k.startswith(b"lmcv:t10:") and b":c:{" in k)
    mine, value = chunk(1, 4096)
    valkey_server.cmd("SET", mine, value)

    attacks = [
        {"op": "promote", "key": v2},
        {"op": "evict", "tier": "ram", "keys": [v2, v10]},
        {"op": "evict", "tier": "nvme", "keys": [v2]},
        {"op": "evict", "tier": "ram", "prefix": b"lmcv:t2:"},
        {"op": "evict", "tier": "ram", "prefix": b"lmcv:t1"},  # SCAN lmcv:t1* would match lmcv:t10:...
        {"op": "evict", "tier": "ram", "prefix": b"lmcv:t1:*"},
        {"op": "evict", "tier": "ram", "prefix": b"lmcv:t1:" + NS.digest.encode() + b":c:[a-z]"},
        {"op": "delete", "keys": [v2]},
        {"op": "delete", "keys": [b"lmcv:t1:" + NS.digest.encode() + b":c:{../../t2/lmcv/" + NS.digest.encode() + b"/07}"]},
        {"op": "delete", "keys": [mine.replace(b"lmcv:t1:", b"lmcv:t1:../t2:")]},
    ]
    for msg in attacks:
        r = tierd.ask(msg)
        assert r["ok"] is False and "bad request" in r["result"] and "tenant 't1'" in r["result"], (msg, r)

    # Hints naming other tenants' chunks would make tierd copy them into t1's tiers.
    tierd.push(protocol.pack({"op": "hint", "put": [[v2, 4096], [v10, 4096]], "hit": [v2]}),
               protocol.pack({"op": "hint", "lease": [[v2, 60_000]], "release": [v10]}))
    # A reply list of another tenant is never written, not even with an error.
    tierd.push(protocol.pack({"op": "stats", "id": 1, "reply": T2_REP}))
    tierd.push(protocol.pack({"op": "promote", "key": v2, "id": 2, "reply": T2_REP}))
    # t1's workers can write t1's delete-intent hash: an intent for t2's chunk is not applied.
    valkey_server.cmd("HSET", protocol.delete_key("lmcv", "t1"), v2, int(time.time() * 1000))
    # t1's own traffic still works, and is copied down
    tierd.push(protocol.pack({"op": "hint", "put": [[mine, len(value)]], "hit": []}))
    assert tierd.ask({"op": "drain", "timeout_s": 30})["ok"]
    deadline = time.monotonic() + 30  # the background pass reads the intents every demote_interval_s
    while valkey_server.cmd("HEXISTS", protocol.delete_key("lmcv", "t1"), v2) and time.monotonic() < deadline:
        time.sleep(0.1)

    for k, v in victims.items():
        assert valkey_server.cmd("GET", k) == v, k
    assert valkey_server.cmd("EXISTS", T2_REP) == 0
    assert not valkey_server.cmd("HEXISTS", protocol.delete_key("lmcv", "t1"), v2)  # removed as junk
    assert len(_chunk_files(nvme_dir)) == 1  # t1's chunk, and only it
    objects = _bucket_keys(moto_s3)
    assert len(objects) == 1 and objects[0].startswith("lmcache-valkey/t1/lmcv/"), objects
    st = tierd.stats()
    assert st["manager"]["bad_requests"] >= len(attacks) + 5
    assert "bad request refused" in tierd.log()

    # and t1's own chunk still comes back from NVMe after its RAM copy is evicted
    assert tierd.ask({"op": "evict", "tier": "ram", "keys": [mine]})["result"] == 1
    assert tierd.ask({"op": "promote", "key": mine})["result"] is True
    assert valkey_server.cmd("GET", mine) == value


def test_a_26_byte_hint_does_not_make_tierd_allocate_gigabytes(valkey_server, tierd):
    raw = msgpack.packb({"op": "hint", "put": [[1200000000, 1]]})
    assert len(raw) <= 26
    tierd.push(raw)
    st = tierd.stats()  # answered after the hint was taken
    assert tierd.proc.poll() is None
    assert _peak_rss_mib(tierd.proc.pid) < 600, "tierd's peak memory grew by the size a request claimed"
    assert st["manager"]["bad_requests"] >= 1


def _hostile_values(rng: random.Random) -> list:
    big = b"lmcv:t1:" + NS.digest.encode() + b":c:{" + b"0" * 32 + b"}"
    return [None, True, -1, 0, 1 << 62, (1 << 64) - 1, -(1 << 63), 1200000000, 3.5, float("nan"), float("inf"),
            "", "x" * 150, b"", b"\x00" * 300, big, big.replace(b"t1", b"t2"), big + b"\n", b"lmcv:t1:*",
            [], [1200000000, 1], [[1200000000, 1]], [big] * 50, [[big, -5]], [[big, 1 << 50]], {"a": 1},
            [[[[[[]]]]]], T2_REP, T1_REP + b"0", rng.randbytes(40)]


def _fuzz_requests(n: int, seed: int = 8) -> list[bytes]:
    """Valid messages with one field replaced by a hostile value, or cut short, or with bytes
    flipped; random bytes; deep nesting."""
    rng = random.Random(seed)
    key = b"lmcv:t1:" + NS.digest.encode() + b":c:{" + b"1" * 32 + b"}"
    templates = [
        {"op": "hint", "put": [[key, 100]], "hit": [key]},
        {"op": "hint", "lease": [[key, 100]], "release": [key]},
        {"op": "promote", "key": key, "reply": T1_REP, "id": 5, "ttl_ms": 500},
        {"op": "evict", "tier": "nvme", "keys": [key], "reply": T1_REP, "id": 6},
        {"op": "evict", "tier": "ram", "prefix": b"lmcv:t1:", "reply": T1_REP, "id": 7},
        {"op": "delete", "keys": [key], "reply": T1_REP, "id": 8, "ttl_ms": 500},
        {"op": "drain", "timeout_s": 0.1, "reply": T1_REP, "id": 9},
        {"op": "stats", "reply": T1_REP, "id": 10},
    ]
    values = _hostile_values(rng)
    out = []
    for i in range(n):
        kind = i % 5
        msg = dict(rng.choice(templates))
        if kind in (0, 1):
            msg[rng.choice(list(msg) + ["op", "ttl_ms", "sent_ms", "nope"])] = rng.choice(values)
            out.append(msgpack.packb(msg, use_bin_type=True))
        elif kind == 2:
            raw = msgpack.packb(msg, use_bin_type=True)
            out.append(raw[: rng.randrange(len(raw))])
        elif kind == 3:
            raw = bytearray(msgpack.packb(msg, use_bin_type=True))
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            out.append(bytes(raw))
        else:
            out.append(rng.choice([rng.randbytes(rng.randint(1, 64)), b"\x91" * 5000, b"\xdd\xff\xff\xff\xff",
                                   b"\xc6\x7f\xff\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\xc7\x01\x05a"]))
    return out


def test_fuzzed_requests_are_answered_or_dropped_and_tierd_keeps_serving(valkey_server, tierd):
    victims = _victims(valkey_server)
    reqs = _fuzz_requests(2500)
    for i in range(0, len(reqs), 250):
        tierd.push(*reqs[i : i + 250])
    st = tierd.stats()  # FIFO: answered after every fuzzed request was taken
    assert tierd.proc.poll() is None
    assert st["manager"]["requests"] >= len(reqs)
    assert st["manager"]["bad_requests"] >= len(reqs) // 2
    assert _peak_rss_mib(tierd.proc.pid) < 600
    for k, v in victims.items():
        assert valkey_server.cmd("GET", k) == v
    assert valkey_server.cmd("EXISTS", T2_REP) == 0
    # every structurally bad request that named a valid reply list got an error there
    bad = [{"op": "promote", "key": 1200000000}, {"op": "evict", "tier": "disk", "keys": []},
           {"op": "drain", "timeout_s": float("nan")}, {"op": "nope"}, {"op": "delete", "keys": "abc"},
           {"op": "stats", "ttl_ms": -1}, {"op": "promote", "key": b"x" * 100_000}]
    for msg in bad:
        r = tierd.ask(msg)
        assert r["ok"] is False and r["result"].startswith("bad request"), (msg, r)
    assert "Traceback" not in tierd.log()


# --- object keys and NVMe files from checked segments only -------------------------------------
HOSTILE_KEYS = [
    b"lmcv:t1:" + NS.digest.encode() + b":c:{../../t2/lmcv/" + NS.digest.encode() + b"/07}",
    b"lmcv:t1:..:c:{07}",
    b"lmcv:t1:a/../../t2:c:{07}",
    b"lmcv:../t2:" + NS.digest.encode() + b":c:{07}",
    b"lmcv:t1:" + NS.digest.encode() + b":c:{07}/x",
    b"lmcv:t1:" + NS.digest.encode() + b":c:{ZZ}",
    b"not a key",
]


async def test_object_keys_and_nvme_files_refuse_unchecked_segments(moto_s3, nvme_dir):
    from lmcache_valkey.tiering.nvme import NvmeTier
    from lmcache_valkey.tiering.object_store import ObjectTier
    from lmcache_valkey.tiering.settings import tiering_settings_from_mapping

    o = ObjectTier(tiering_settings_from_mapping({"s3_bucket": moto_s3.bucket, "s3_endpoint_url": moto_s3.url}))
    await o.start()
    await o.create_bucket()
    nv = NvmeTier(nvme_dir, 1 << 26)
    await nv.start()
    try:
        _, value = chunk(7, 4096)
        for key in HOSTILE_KEYS:
            with pytest.raises(ValueError):
                o.object_key(key)
            assert await o.write(key, [value]) is False
            with pytest.raises(ValueError):
                await nv.write(key, [value])
        assert await o.flush(30)
        assert _bucket_keys(moto_s3) == [] and _chunk_files(nvme_dir) == []
        assert o.stats["bad_keys"] == len(HOSTILE_KEYS)
        # objects planted in the bucket under names outside the grammar are not listed
        import boto3

        s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1")
        for name in ("lmcache-valkey/t1/lmcv/" + NS.digest + "/ZZ", "lmcache-valkey/t1/lm:cv/x/00",
                     "lmcache-valkey/t1/lmcv/../00/00"):
            s3.put_object(Bucket=moto_s3.bucket, Key=name, Body=value)
        good, _ = chunk(8, 4096)
        assert await o.put(good, [value]) is not False
        listed = [x.key async for x in o.inventory("t1")]
        assert listed == [good]
    finally:
        await o.close()
        await nv.close()



async def test_a_burst_of_hints_is_sent_in_requests_tierd_accepts(valkey_server):
    """A worker that queued more hints than one request may carry (a large batched put) splits
    them: every message it pushes passes tierd's checks, and no hint is lost."""
    from tierhelp import resp_client

    from lmcache_valkey.tiering import RemoteTierClient
    from lmcache_valkey.tiering.requests import MAX_KEYS, TenantScope
    from lmcache_valkey.tiering.service import parse

    client = await resp_client(valkey_server)
    tc = RemoteTierClient(client, client.settings)
    try:
        keys = [NS.data_key(f"{i:032x}") for i in range(MAX_KEYS + 5000)]
        for k in keys:  # no await yields here: all of them are pending at once
            await tc.note_put(k, 1000)
        await tc.lease(keys[:10], 5.0)
        await tc.flush_hints()
    finally:
        await tc.close()
        await client.close()

    raws = valkey_server.cmd("LRANGE", T1_REQ, 0, -1)
    reqs = [parse(r, TenantScope("lmcv", "t1")) for r in raws]  # raises on any refused message
    assert len(reqs) >= 2 and sum(len(r.puts) for r in reqs) == MAX_KEYS + 5000
    assert sum(len(r.leases) for r in reqs) == 10
