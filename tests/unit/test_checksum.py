"""The payload CRC32C is the same function whichever library computes it (ISA-L or the crc32c
package), for every buffer a store hands it, and a process can be told which one to use."""

import os
import random
import subprocess
import sys

import crc32c as reference
import pytest

from lmcache_valkey import checksum
from lmcache_valkey.errors import ConfigError


def test_this_machine_uses_isal():
    # scripts/setup.sh installs libisal2: a set-up that lost it would silently run the slow path.
    assert checksum.IMPLEMENTATION == "isal"


@pytest.mark.parametrize("n", [0, 1, 63, 4096, checksum.ISAL_MIN - 1, checksum.ISAL_MIN,
                               checksum.ISAL_MIN + 1, 1 << 20, (4 << 20) + 7])
def test_matches_the_reference_at_every_size(n):
    data = bytearray(random.Random(n).randbytes(n))
    assert checksum.crc32c(data) == reference.crc32c(bytes(data))


def test_reads_every_buffer_kind_in_place_at_any_offset():
    rng = random.Random(7)
    base = bytearray(rng.randbytes(3 << 20))
    for _ in range(40):
        at = rng.randrange(0, 1 << 20)
        n = rng.randrange(0, 2 << 20)
        want = reference.crc32c(bytes(base[at : at + n]))
        view = memoryview(base)[at : at + n]
        assert checksum.crc32c(view) == want  # writable, unaligned
        assert checksum.crc32c(view.toreadonly()) == want
        assert checksum.crc32c(bytes(view)) == want
    # A typed view counts bytes, not items (an LMCache tensor seen as floats).
    floats = memoryview(base)[: 1 << 20].cast("f")
    assert checksum.crc32c(floats) == reference.crc32c(bytes(base[: 1 << 20]))


def test_chains_across_pieces_and_across_implementations():
    data = bytearray(random.Random(3).randbytes(5 << 20))
    whole = reference.crc32c(data)
    for cuts in ([0], [100], [checksum.ISAL_MIN - 5], [1 << 20, 3 << 20], [17, 70_000, 4 << 20]):
        value, at = 0, 0
        for cut in cuts + [len(data)]:
            value = checksum.crc32c(memoryview(data)[at:cut], value)
            at = cut
        assert value == whole
    # A CRC started by one library continues correctly in the other (a reply's first piece is
    # small, the rest big).
    head = reference.crc32c(data[:1000])
    assert checksum.crc32c(memoryview(data)[1000:], head) == whole


def test_buffers_longer_than_one_isal_call_go_in_pieces(monkeypatch):
    if checksum.IMPLEMENTATION != "isal":
        pytest.skip("ISA-L not loaded")
    monkeypatch.setattr(checksum, "_ISAL_PIECE", (1 << 20) + 3)  # crc32_iscsi takes an int length
    data = bytearray(random.Random(5).randbytes((5 << 20) + 11))
    assert checksum.crc32c(data) == reference.crc32c(data)


def test_a_non_contiguous_view_is_refused_not_misread():
    strided = memoryview(bytearray(1 << 20))[::2]
    with pytest.raises(BufferError):
        checksum.crc32c(strided)


def _implementation_with(env_value):
    env = dict(os.environ, LMCACHE_VALKEY_CRC32C=env_value)
    return subprocess.run([sys.executable, "-c", "from lmcache_valkey import checksum; print(checksum.IMPLEMENTATION)"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_environment_picks_the_implementation():
    assert _implementation_with("crc32c").stdout.strip() == "crc32c"
    assert _implementation_with("isal").stdout.strip() == "isal"
    bad = _implementation_with("fastest")
    assert bad.returncode != 0 and "ConfigError: invalid setting 'LMCACHE_VALKEY_CRC32C'" in bad.stderr
    assert "expected auto, isal or crc32c, got 'fastest'" in bad.stderr


def test_isal_required_but_missing_fails_naming_the_package(monkeypatch):
    monkeypatch.setenv("LMCACHE_VALKEY_CRC32C", "isal")
    monkeypatch.setattr(checksum, "_ISAL_SONAME", "libisal-not-here.so.9")
    with pytest.raises(ConfigError, match="libisal2") as refused:
        checksum._choose()
    assert "LMCACHE_VALKEY_CRC32C" in str(refused.value) and "got 'isal'" in str(refused.value)
    monkeypatch.setenv("LMCACHE_VALKEY_CRC32C", "auto")  # auto falls back to the crc32c package
    name, fn, missing = checksum._choose()
    assert name == "crc32c" and fn(b"abc") == reference.crc32c(b"abc")
    assert "libisal-not-here.so.9" in missing and "libisal2" in missing


@pytest.mark.parametrize("len_a,len_b", [(0, 0), (0, 5), (5, 0), (512, 1), (512, 4 << 20), (3, 123_457), (1 << 16, 7)])
def test_the_crc_of_two_pieces_combines_without_reading_them(len_a, len_b):
    a, b = os.urandom(len_a), os.urandom(len_b)
    assert checksum.crc32c_combine(checksum.crc32c(a), checksum.crc32c(b), len_b) == reference.crc32c(a + b)


def test_combining_refuses_a_negative_length():
    with pytest.raises(ValueError, match="len_b"):
        checksum.crc32c_combine(1, 2, -1)
