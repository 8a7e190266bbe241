"""Errors specific to the fabric path, all subclasses of ``lmcache_valkey.errors``."""

from __future__ import annotations

from lmcache_valkey.errors import DeadlineExceeded, FabricUnavailable, ServerError, TransportError

__all__ = [
    "FabricUnavailable",
    "NoFabricSession",
    "PeerNotProven",
    "OutsideRegions",
    "WindowTooSmall",
    "TransferFailed",
    "ChecksumRefused",
    "ServerDeadline",
    "UnregisteredBuffer",
]


class NoFabricSession(ServerError):
    """The server saw no BLOB.RDMA_HELLO on this connection ("no RDMA session", NOHELLO)."""

    cause = "nohello"


class PeerNotProven(NoFabricSession):
    """The session's fabric address is not proven (NOPROOF): the server requires HELLO with
    PROOF, or the proof was not answered or was wrong."""

    cause = "noproof"


class OutsideRegions(ServerError):
    """A triple lies outside the regions the session declared at HELLO (BADREGION)."""

    cause = "region"


class WindowTooSmall(ServerError):
    """The buffers offered are smaller than the object (BADWINDOW); nothing moved."""

    cause = "window"


class TransferFailed(ServerError):
    """The server's fi_write/fi_read failed (bad rkey, peer gone...); all its ops drained."""

    cause = "fabric"


class ChecksumRefused(ServerError):
    """The server read bytes whose CRC32C differs from the ``CRC`` the SET announced, and
    stored nothing: the buffer changed under the transfer, or the bytes were damaged on the
    way. Never retried another way (the bulk path would store the same wrong bytes)."""

    cause = "crc"


class ServerDeadline(DeadlineExceeded):
    """The server stopped a transfer at its deadline. ``inflight`` operations it had
    posted may still complete into or out of the client's buffers."""

    def __init__(self, message: str, inflight: int) -> None:
        super().__init__(message)
        self.inflight = inflight


class UnregisteredBuffer(TransportError, ValueError):
    """A buffer handed to the fabric transport lies outside every registered region."""

    cause = "unregistered"
