"""CRC32C (Castagnoli) of payload bytes: the one module that calls a checksum library.

Every chunk's payload is checksummed once on put and verified once on get, so on a
CPU-bound client (and a client that shares cores with the server) the CRC's cycles per byte
are taken straight out of throughput. Two implementations compute the same function:

- **ISA-L** (Intel's storage-acceleration library, ``libisal2`` on Debian/Ubuntu, loaded by
  cffi in ABI mode, nothing compiled): ``crc32_iscsi`` folds with carry-less multiplies
  (AVX-512 VPCLMULQDQ where the CPU has it: ~48 GB/s on a buffer in cache, ~27 GB/s reading
  from memory, on a 2-core EPYC with it). Without AVX-512 (AMD Zen 3) it runs its SSE4.2
  routine, ~24 GB/s on a 4 MiB buffer: no faster than the crc32c package there, and a 256-bit
  VPCLMULQDQ fold is no faster either (docs/throughput.md).
- **the crc32c package** (the SSE4.2 ``crc32`` instruction, three streams): ~25 GB/s in
  cache, ~12 GB/s from memory. Always used below ``ISAL_MIN`` bytes (headers, small
  pieces of a reply), where the cffi call costs more than it saves (~0.65 µs against
  ~0.1 µs per call, equal at ~16 KiB), and for everything when ISA-L is not there.

``LMCACHE_VALKEY_CRC32C`` picks one: ``auto`` (default: ISA-L when ``libisal.so.2`` loads),
``isal`` (required: failing to load it is a ConfigError at import, naming the package to
install) or ``crc32c``; any other value is a ConfigError at import too (the console script
reports either as one line, exit code 2). Both release the GIL on large buffers (cffi on
every call, the crc32c package from 32 KiB), so the store's CRC threads run them beside
the I/O loop.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import crc32c as _crc32c

from .errors import ConfigError

__all__ = ["crc32c", "crc32c_combine", "IMPLEMENTATION", "ISAL_MIN", "ISAL_MISSING"]

ISAL_MIN = 32 << 10
# crc32_iscsi takes an int length: longer buffers go in pieces of this size.
_ISAL_PIECE = 1 << 30
_ISAL_SONAME = "libisal.so.2"
_ENV = "LMCACHE_VALKEY_CRC32C"


def _load_isal() -> tuple[Callable[..., int], Callable[..., Any]] | str:
    """(crc32_iscsi, ffi.from_buffer), or why ISA-L cannot be used."""
    try:
        import cffi
    except ImportError as e:  # a dependency, so only a broken environment gets here
        return f"cffi is not importable ({e})"
    ffi = cffi.FFI()
    ffi.cdef("unsigned int crc32_iscsi(unsigned char *buffer, int len, unsigned int init_crc);")
    try:
        lib = ffi.dlopen(_ISAL_SONAME)
    except OSError as e:
        return f"{_ISAL_SONAME} did not load ({e}); install libisal2 (apt) or isa-l"
    return lib.crc32_iscsi, ffi.from_buffer


def _choose() -> tuple[str, Callable[..., int], str | None]:
    """(implementation, function, why ISA-L is not used when it was not ruled out by choice)."""
    want = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "isal", "crc32c"):
        raise ConfigError(_ENV, "auto, isal or crc32c", want)
    small = _crc32c.crc32c
    if want == "crc32c":
        return "crc32c", small, None
    loaded = _load_isal()
    if isinstance(loaded, str):
        if want == "isal":
            raise ConfigError(_ENV, f"auto or crc32c, since {loaded}", want)
        return "crc32c", small, loaded
    crc32_iscsi, from_buffer = loaded

    def crc(data: Any, value: int = 0) -> int:
        t = type(data)
        if t is memoryview:
            n = data.nbytes
        elif t is bytes or t is bytearray:
            n = len(data)
        else:  # any other buffer: its length in bytes, not in its first dimension's items
            data = memoryview(data)
            n = data.nbytes
        if n < ISAL_MIN:
            return small(data, value)
        # ISA-L's crc32_iscsi neither pre- nor post-inverts: do both, as the crc32c
        # package does, so the two agree and chain into each other.
        if n <= _ISAL_PIECE:
            return crc32_iscsi(from_buffer(data), n, value ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
        view = memoryview(data).cast("B")
        for at in range(0, n, _ISAL_PIECE):
            piece = view[at : at + _ISAL_PIECE]
            value = crc32_iscsi(from_buffer(piece), piece.nbytes, value ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
        return value

    return "isal", crc, None


#: Which implementation this process uses ("isal" or "crc32c"), and the function:
#: ``crc32c(data, value=0)`` is the CRC32C of ``data`` continuing from ``value`` (the CRC of
#: what came before; 0 to start). It reads bytes, bytearrays and contiguous memoryviews in
#: place, writable or not. It runs once per received piece, so it is bound as the module
#: attribute itself: the crc32c package's function, or one Python function in front of ISA-L.
#: ``ISAL_MISSING``: why ISA-L did not load when it was wanted (``lmcache-valkey doctor``
#: warns with it), else None.
IMPLEMENTATION: str
crc32c: Callable[..., int]
ISAL_MISSING: str | None
IMPLEMENTATION, crc32c, ISAL_MISSING = _choose()


# -- combining: the CRC of A+B from the CRCs of A and B ----------------------------------------
# CRC32C is linear over GF(2): crc(A+B) = crc(A) * x^(8*len(B)) mod P  xor  crc(B), in the
# reflected bit order the CRC uses (zlib's crc32_combine, with Castagnoli's polynomial). It
# lets a value's CRC be had without reading it again when the CRC of its parts is known.
_POLY = 0x82F63B78  # Castagnoli, reflected
_X0 = 1 << 31  # the polynomial 1 in reflected order


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the polynomial (both reflected, 32 bits)."""
    m, p = _X0, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """x^(2^k) modulo the polynomial, k = 0..63."""
    out = [_X0 >> 1]  # x^1
    for _ in range(63):
        out.append(_multmodp(out[-1], out[-1]))
    return out


_X2N = _powers()


@functools.lru_cache(maxsize=64)
def _shift(nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial. Cached: a deployment's values have a few sizes."""
    p, k = _X0, 3  # 8 * nbytes = nbytes << 3
    while nbytes:
        if nbytes & 1:
            p = _multmodp(_X2N[k & 63], p)
        nbytes >>= 1
        k += 1
    return p


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """The CRC32C of A followed by B, from ``crc_a = crc32c(A)``, ``crc_b = crc32c(B)`` and
    ``len_b = len(B)``: no byte is read. A few microseconds (the shift is cached by length)."""
    if len_b < 0:
        raise ValueError(f"len_b must be >= 0, got {len_b}")
    return _multmodp(_shift(len_b), crc_a) ^ crc_b
