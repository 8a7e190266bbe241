"""DUMP payloads of module values, taken apart and put back together for RESTORE tests.

A DUMP is ``<type byte><value><2-byte RDB version><8-byte CRC64>``; a module value is its
module id (a length-encoded 64-bit integer whose low 10 bits are the encoding version)
followed by typed fields, each an opcode then the field, and an EOF opcode. RESTORE checks
the CRC64 (Jones polynomial, reflected) before it parses anything, so a crafted payload
must carry a recomputed one to reach the module's loader.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OP_EOF, OP_SINT, OP_UINT, OP_FLOAT, OP_DOUBLE, OP_STRING = 0, 1, 2, 3, 4, 5
TYPE_MODULE_2 = 7


def _crc64_table() -> list[int]:
    poly = 0x95AC9329AC4BC9B5  # 0xad93d23594c935a9, bit-reflected
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc64_table()


def crc64(data: bytes) -> int:
    crc = 0
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def seal(body: bytes, rdb_version: bytes) -> bytes:
    """Body (type byte + value) plus the RDB version and a correct CRC64."""
    head = body + rdb_version
    return head + struct.pack("<Q", crc64(head))


def length(n: int) -> bytes:
    """RDB length encoding."""
    if n < 1 << 6:
        return bytes([n])
    if n < 1 << 14:
        return bytes([0x40 | n >> 8, n & 0xFF])
    if n < 1 << 32:
        return b"\x80" + struct.pack(">I", n)
    return b"\x81" + struct.pack(">Q", n)


def read_length(buf: bytes, i: int) -> tuple[int, int]:
    kind = buf[i] >> 6
    if kind == 0:
        return buf[i] & 0x3F, i + 1
    if kind == 1:
        return (buf[i] & 0x3F) << 8 | buf[i + 1], i + 2
    if buf[i] == 0x80:
        return struct.unpack(">I", buf[i + 1 : i + 5])[0], i + 5
    if buf[i] == 0x81:
        return struct.unpack(">Q", buf[i + 1 : i + 9])[0], i + 9
    raise ValueError(f"not a plain length at {i}: {buf[i]:#x}")


@dataclass
class ModuleDump:
    module_id: int  # high 54 bits: the type name; low 10 bits: encoding version
    rdb_version: bytes

    @classmethod
    def parse(cls, dump: bytes) -> "ModuleDump":
        assert dump[0] == TYPE_MODULE_2, dump[:1]
        assert crc64(dump[:-8]) == struct.unpack("<Q", dump[-8:])[0], "CRC64 implementation disagrees with the server"
        module_id, _ = read_length(dump, 1)
        return cls(module_id, dump[-10:-8])

    def build(self, fields: list[tuple[int, bytes]], *, encver: int | None = None, eof: bool = True) -> bytes:
        """A RESTORE payload of this module type. ``fields``: (opcode, encoded field)."""
        mid = self.module_id if encver is None else (self.module_id & ~1023) | encver
        body = bytes([TYPE_MODULE_2]) + length(mid)
        for op, field in fields:
            body += length(op) + field
        if eof:
            body += length(OP_EOF)
        return seal(body, self.rdb_version)


def string_field(data: bytes) -> tuple[int, bytes]:
    return OP_STRING, length(len(data)) + data


def uint_field(n: int) -> tuple[int, bytes]:
    return OP_UINT, length(n)
