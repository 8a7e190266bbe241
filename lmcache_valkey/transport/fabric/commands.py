"""The BLOB.* command dialect, client side: names and reply/error decoding in one place.

The dialect is valkey-large-object's (``BLOB.RDMA_HELLO``, ``BLOB.RDMA_SET``,
``BLOB.RDMA_GET``, ``BLOB.TCP_SET``, ``BLOB.TCP_GET``, ``BLOB.INFO``), as documented on
valkey.io; our reference module speaks it too (endpoint/include/lmcv_commands.h and
lmcv_replies.h mirror this module; a test checks they agree). Our extensions -- the
address proof, declared regions, and the ``PX``/``TIMEOUT``/``PARTIAL`` options -- are
optional arguments a server without them refuses; they are sent only to a server that took
the extended HELLO (docs/fabric-command-dialect.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from lmcache_valkey.errors import FabricUnavailable, LmcacheValkeyError, ProtocolError, server_error

from ..resp.parser import SimpleString, describe
from .errors import (
    ChecksumRefused,
    NoFabricSession,
    OutsideRegions,
    PeerNotProven,
    ServerDeadline,
    TransferFailed,
    WindowTooSmall,
)

HELLO = "BLOB.RDMA_HELLO"
RDMA_SET = "BLOB.RDMA_SET"
RDMA_GET = "BLOB.RDMA_GET"
TCP_SET = "BLOB.TCP_SET"
TCP_GET = "BLOB.TCP_GET"
INFO = "BLOB.INFO"
PROVE = "BLOB.RDMA_PROVE"  # extension: completes RDMA_HELLO ... PROOF
UPSTREAM = (HELLO, RDMA_SET, RDMA_GET, TCP_SET, TCP_GET, INFO)
ALL = (*UPSTREAM, PROVE)
# Our earlier names, still answered by our module for one release (deprecated).
LEGACY = ("BLOB.HELLO", "BLOB.SET", "BLOB.GET")
DELETE = "UNLINK"  # what the worker's ACL line already allows for its keys
EXPIRE = "PEXPIRE"  # TTL against a server without our PX option
ACL_CATEGORY = "largeobj"  # the modules' ACL category (Valkey 9.1: +@largeobj)

OPT_CRC = "CRC"
OPT_PX = "PX"
OPT_TIMEOUT = "TIMEOUT"
OPT_PARTIAL = "PARTIAL"
OPT_PROOF = "PROOF"
OPT_REGION = "REGION"
INFO_FIELDS = ("LEN", "CRC", "TIER")
# Our module's INFO section (``INFO lmcvblob``): which mode it runs in (module argument
# ``require_proof``; docs/security.md). "unproven" comes with a ``peer_warning`` field.
INFO_SECTION = "lmcvblob"
PEER_MODE_PROVEN = "proven"
PEER_MODE_UNPROVEN = "unproven"

NONCE_BYTES = 16
MAX_REGIONS = 32
MAX_TRIPLES = 256
# What a reply may carry (the server is not trusted: docs/resp-reply-bounds.md): lengths
# below a TiB (no value is near it), 32-bit CRCs, a few server addresses of bounded size.
MAX_VALUE_LEN = 1 << 40
MAX_CRC = (1 << 32) - 1
MAX_SERVER_ADDRESSES = 16
MAX_ADDRESS_BYTES = 512

Triple = tuple[int, int, int]  # (rkey, remote addr, length)


def hello(name: bytes, proof: bool = False, regions: Sequence[Triple] = ()) -> list[object]:
    """HELLO, with our extensions when asked: PROOF (the reply carries a nonce) and the
    REGIONs this session may use. A server without them refuses the extended form."""
    args: list[object] = [HELLO, name.hex()]
    if proof:
        args.append(OPT_PROOF)
    for r in regions:
        args += [OPT_REGION, *r]
    return args


def parse_hello_reply(reply: object, proof: bool) -> tuple[list[bytes], bytes | None]:
    """(server fabric addresses, nonce): plain ``[addr, ...]``, or with PROOF
    ``[[addr, ...], nonce]``. Anything else is a :class:`ProtocolError`: at most
    ``MAX_SERVER_ADDRESSES`` addresses, each hex of at most ``MAX_ADDRESS_BYTES`` bytes."""
    def addresses(items: object) -> list[bytes]:
        if not isinstance(items, list) or len(items) > MAX_SERVER_ADDRESSES:
            raise ProtocolError(f"unexpected {HELLO} reply: {describe(reply)}")
        out = []
        for a in items:
            if not isinstance(a, bytes) or not 0 < len(a) <= 2 * MAX_ADDRESS_BYTES:
                raise ProtocolError(f"unexpected {HELLO} address: {describe(a)}")
            try:
                out.append(bytes.fromhex(a.decode("ascii")))
            except ValueError:  # not ASCII, not hex
                raise ProtocolError(f"{HELLO} address is not hex: {describe(a)}") from None
        return out

    if not proof:
        return addresses(reply), None
    if not (isinstance(reply, list) and len(reply) == 2 and type(reply[1]) is bytes
            and len(reply[1]) == NONCE_BYTES):
        raise ProtocolError(f"unexpected {HELLO} PROOF reply: {describe(reply)}")
    return addresses(reply[0]), reply[1]


def prove(rkey: int, addr: int) -> list[object]:
    return [PROVE, rkey, addr]


def get_rma(key: bytes, triples: Sequence[Triple], timeout_ms: int, partial: bool, extensions: bool) -> list[object]:
    args: list[object] = [RDMA_GET, key]
    for t in triples:
        args.extend(t)
    if extensions:
        args += [OPT_TIMEOUT, timeout_ms]
        if partial:
            args.append(OPT_PARTIAL)
    return args


def set_rma(key: bytes, total: int, triples: Sequence[Triple], ttl_ms: int | None, timeout_ms: int,
            extensions: bool, crc: int | None = None) -> list[object]:
    """RDMA_SET; ``CRC`` (upstream: the server stores nothing unless the bytes it read have
    this CRC32C) when known; the TTL and deadline only as our extension (else: ``expire``
    after it)."""
    args: list[object] = [RDMA_SET, key, total]
    if crc is not None:
        args += [OPT_CRC, crc]
    for t in triples:
        args.extend(t)
    if extensions:
        if ttl_ms:
            args += [OPT_PX, ttl_ms]
        args += [OPT_TIMEOUT, timeout_ms]
    return args


def get_bulk(key: bytes) -> list[object]:
    return [TCP_GET, key]


def set_bulk(key: bytes, value: bytes | memoryview, ttl_ms: int | None, extensions: bool) -> list[object]:
    args: list[object] = [TCP_SET, key, value]
    if ttl_ms and extensions:
        args += [OPT_PX, ttl_ms]
    return args


def expire(key: bytes, ttl_ms: int) -> list[object]:
    return [EXPIRE, key, ttl_ms]


def _value_len(v: object) -> bool:
    return type(v) is int and 0 <= v <= MAX_VALUE_LEN


def _crc(v: object) -> bool:
    return type(v) is int and 0 <= v <= MAX_CRC


def _name(k: object) -> str | None:
    if isinstance(k, bytes):
        return k.decode("ascii", "replace").upper()
    return k.upper() if isinstance(k, str) else None


def parse_get_reply(reply: object, command: str = RDMA_GET) -> tuple[int, int] | None:
    """``[obj_len, crc32c]`` -> (obj_len, crc); nil -> None (miss). Anything else (a
    negative or absurd length, a CRC past 32 bits, a bulk, a status) is a :class:`ProtocolError`."""
    if reply is None:
        return None
    if isinstance(reply, list) and len(reply) == 2 and _value_len(reply[0]) and _crc(reply[1]):
        return reply[0], reply[1]
    raise ProtocolError(f"unexpected {command} reply: {describe(reply)}")


def parse_info_reply(reply: object) -> tuple[int, int] | None:
    """``[len, n, crc, c, tier, t]`` (names in any case) -> (length, crc32c); nil -> None.
    Anything else is a :class:`ProtocolError`."""
    if reply is None:
        return None
    if isinstance(reply, list) and len(reply) % 2 == 0 and len(reply) <= 2 * len(INFO_FIELDS) + 8:
        names = [_name(k) for k in reply[0::2]]
        fields = dict(zip(names, reply[1::2]))
        n, crc = fields.get("LEN"), fields.get("CRC")
        if _value_len(n) and _crc(crc):
            return n, crc
    raise ProtocolError(f"unexpected {INFO} reply: {describe(reply)}")


# At most 9 digits: a server's count is small, and int() of thousands of digits raises.
_INFLIGHT = re.compile(r"inflight=(\d{1,9})\b")


# valkey-large-object's refusals that carry a meaning the client acts on, by their start.
_UPSTREAM_ERRORS: tuple[tuple[str, type[LmcacheValkeyError]], ...] = (
    ("ERR no RDMA session", NoFabricSession),
    ("ERR RDMA write failed", TransferFailed),
    ("ERR RDMA read failed", TransferFailed),
    ("ERR client address space smaller than object length", WindowTooSmall),
    ("ERR value of ", WindowTooSmall),  # Momento's DMA.GET: "... exceeds the client buffer of N bytes"
    ("ERR RDMA provider unavailable", FabricUnavailable),
    ("ERR payload CRC32C does not match", ChecksumRefused),  # our module's words for it
    ("ERR checksum mismatch", ChecksumRefused),  # Momento's module (large-object 0.1.0 publishes none)
)


# Our endpoint's error codes (the first word of the reply) beside the server's own table
# (errors.SERVER_ERROR_PREFIXES); TIMEOUT carries how many operations were still in flight.
_CODES: dict[str, Callable[[str], LmcacheValkeyError]] = {
    "NOHELLO": NoFabricSession,
    "NOPROOF": PeerNotProven,
    "BADREGION": OutsideRegions,
    "BADWINDOW": WindowTooSmall,
    "XFERFAILED": TransferFailed,
    "NOFABRIC": FabricUnavailable,
    "TIMEOUT": lambda message: ServerDeadline(message, int(m.group(1)) if (m := _INFLIGHT.search(message)) else 1),
}


def map_error(message: str) -> LmcacheValkeyError:
    """Typed exception for an error reply of the endpoint (either dialect)."""
    code = message.split(" ", 1)[0]
    if code == "ERR":
        for start, cls in _UPSTREAM_ERRORS:
            if message.startswith(start):
                return cls(message)
    return _CODES.get(code, server_error)(message)


class LargeObjectDialect:
    """The calls :class:`~.transport.FabricTransport` and :class:`~.link.FabricLink` make of a
    dialect, for valkey-large-object's (the other one: :data:`.dma.DMA`)."""

    name = "large-object"
    hello_command = HELLO
    one_region = False  # up to MAX_TRIPLES triples per command
    data_type = "module"  # values are the module's type: TCP_GET, not GET, reads them

    hello = staticmethod(hello)
    parse_hello_reply = staticmethod(parse_hello_reply)
    prove = staticmethod(prove)

    def get_rma(self, key: bytes, triples: Sequence[Triple], timeout_ms: int, partial: bool, extensions: bool,
                address: bytes) -> list[object]:
        return get_rma(key, triples, timeout_ms, partial, extensions)

    def parse_get_reply(self, reply: object) -> tuple[int, int] | None:
        return parse_get_reply(reply)

    def set_rma(self, key: bytes, total: int, triples: Sequence[Triple], ttl_ms: int | None, timeout_ms: int,
                extensions: bool, crc: int | None, address: bytes) -> list[list[object]]:
        """RDMA_SET; without our PX option the TTL follows in the same round trip."""
        cmd = set_rma(key, total, triples, ttl_ms, timeout_ms, extensions, crc)
        return [cmd, expire(key, ttl_ms)] if ttl_ms and not extensions else [cmd]

    def check_set_reply(self, reply: object, total: int) -> None:
        if not (isinstance(reply, SimpleString) and reply == b"OK"):
            raise ProtocolError(f"unexpected {RDMA_SET} reply: {describe(reply)}")

    def get_bulk(self, key: bytes) -> list[object]:
        return get_bulk(key)

    def set_bulk(self, key: bytes, value: bytes, ttl_ms: int | None) -> list[list[object]]:
        # Plain connections have no HELLO to tell whether PX is taken: the TTL follows in the
        # same round trip, which every server takes.
        cmd = set_bulk(key, value, None, False)
        return [cmd, expire(key, ttl_ms)] if ttl_ms else [cmd]

    def info(self, key: bytes) -> list[list[object]]:
        return [[INFO, key]]

    def parse_info_reply(self, replies: object) -> tuple[int, int] | None:
        return parse_info_reply(replies)


LARGE_OBJECT = LargeObjectDialect()
