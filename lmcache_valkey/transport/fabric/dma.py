"""Momento's DMA command dialect, client side: names, argument order and reply decoding in one
place (momentohq/vdma, ``design/Design.md``; our reference module speaks it too,
endpoint/include/lmcv_commands.h)::

    DMA.HELLO                                                   -> [server address hex, ...]
    DMA.SET <address> <rkey> <remote-address> <length> <key> [<crc>]      -> length
    DMA.GET <address> <rkey> <remote-address> <capacity> <key> [<crc-flag>] -> [n, crc] | nil
    DMA.INFO                                                    -> ["field: value", ...]

``<address>`` is this client's fabric address in hex, in every command; one region per
command (a value that is not one registered range moves through the transport's bounce
buffer); values are plain Valkey strings, so the bulk path is ``GET``/``SET`` and a fleet of
fabric and RESP workers shares them. Our extension, sent as ``DMA.HELLO <address> PROOF
[REGION ...]`` then ``DMA.PROVE``: a server without it (Momento's ignores HELLO's arguments)
answers the plain address list, and the session stays unproven (docs/fabric-dma-dialect.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmcache_valkey.errors import ProtocolError

from ..resp.parser import describe
from . import commands
from .commands import Triple

NAME = "dma"
HELLO = "DMA.HELLO"
SET = "DMA.SET"
GET = "DMA.GET"
INFO = "DMA.INFO"
PROVE = "DMA.PROVE"  # extension: completes DMA.HELLO <address> PROOF
ALL = (HELLO, SET, GET, INFO, PROVE)
BULK_GET = "GET"
BULK_SET = "SET"
CRC_FLAG = 1  # DMA.GET's trailing flag: its presence asks for the CRC, its value is not read


class DmaDialect:
    """The calls :class:`~.transport.FabricTransport` and :class:`~.link.FabricLink` make of a
    dialect (the large-object one is :data:`commands.LARGE_OBJECT`)."""

    name = NAME
    hello_command = HELLO
    one_region = True  # one (rkey, addr, len) per command
    data_type = "string"  # what a RESP GET of a stored value returns

    def hello(self, name: bytes, proof: bool = False, regions: Sequence[Triple] = ()) -> list[object]:
        if not proof:
            return [HELLO]
        args: list[object] = [HELLO, name.hex(), commands.OPT_PROOF]
        for r in regions:
            args += [commands.OPT_REGION, *r]
        return args

    def parse_hello_reply(self, reply: object, proof: bool) -> tuple[list[bytes], bytes | None]:
        """(server addresses, nonce). A server without our extension answers the plain list
        to the extended HELLO too: no nonce then (the session is not proven)."""
        if proof and isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], list):
            return commands.parse_hello_reply(reply, proof=True)
        return commands.parse_hello_reply(reply, proof=False)

    def prove(self, rkey: int, addr: int) -> list[object]:
        return [PROVE, rkey, addr]

    def get_rma(self, key: bytes, triples: Sequence[Triple], timeout_ms: int, partial: bool, extensions: bool,
                address: bytes) -> list[object]:
        (rkey, raddr, cap), = triples
        return [GET, address.hex(), rkey, raddr, cap, key, CRC_FLAG]

    def parse_get_reply(self, reply: object) -> tuple[int, int] | None:
        """``[n, crc32c]`` (we always send the flag) -> (n, crc); nil -> None."""
        return commands.parse_get_reply(reply, GET)

    def set_rma(self, key: bytes, total: int, triples: Sequence[Triple], ttl_ms: int | None, timeout_ms: int,
                extensions: bool, crc: int | None, address: bytes) -> list[list[object]]:
        """DMA.SET, and the TTL as a PEXPIRE in the same round trip (DMA.SET, like SET,
        leaves the key without one)."""
        (rkey, raddr, n), = triples
        cmd: list[object] = [SET, address.hex(), rkey, raddr, n, key]
        if crc is not None:
            cmd.append(crc)
        return [cmd, commands.expire(key, ttl_ms)] if ttl_ms else [cmd]

    def check_set_reply(self, reply: object, total: int) -> None:
        if type(reply) is not int or reply != total:
            raise ProtocolError(f"unexpected {SET} reply: {describe(reply)} (stored {total} bytes)")

    def get_bulk(self, key: bytes) -> list[object]:
        return [BULK_GET, key]

    def set_bulk(self, key: bytes, value: bytes, ttl_ms: int | None) -> list[list[object]]:
        return [[BULK_SET, key, value, "PX", ttl_ms] if ttl_ms else [BULK_SET, key, value]]

    def info(self, key: bytes) -> list[list[object]]:
        return [["EXISTS", key], ["STRLEN", key]]

    def parse_info_reply(self, replies: object) -> tuple[int, int | None] | None:
        """(length, None: a string carries no CRC) or None for an absent key."""
        if not (isinstance(replies, list) and len(replies) == 2 and all(type(r) is int for r in replies)):
            raise ProtocolError(f"unexpected EXISTS/STRLEN replies: {describe(replies)}")
        exists, n = replies
        return (n, None) if exists else None


DMA = DmaDialect()
