"""libfabric fast path: the cffi binding, the client data plane and the BLOB.* dialect.

Importing this package never needs libfabric: the binding is built and loaded when a
``FabricTransport(data_path="rma")`` or ``FabricEndpoint`` is created, and a missing
libfabric raises ``FabricUnavailable`` saying what to install.

Never imports ``lmcache`` nor the store; callers pass keys (bytes) and buffers.
"""

from lmcache_valkey.errors import FabricUnavailable

from .binding import available, libfabric_version
from .endpoint import PROVIDERS, FabricEndpoint, FabricError, MemoryRegion
from . import commands
from .errors import (
    NoFabricSession,
    OutsideRegions,
    PeerNotProven,
    ServerDeadline,
    TransferFailed,
    UnregisteredBuffer,
    WindowTooSmall,
)
from .link import RawSpan
from .cluster import ClusterFabricTransport
from .factory import open_fabric_transport
from .transport import DATA_PATHS, FabricTransport

__all__ = [
    "ClusterFabricTransport",
    "DATA_PATHS",
    "PROVIDERS",
    "FabricEndpoint",
    "FabricError",
    "FabricTransport",
    "FabricUnavailable",
    "MemoryRegion",
    "NoFabricSession",
    "OutsideRegions",
    "PeerNotProven",
    "RawSpan",
    "ServerDeadline",
    "TransferFailed",
    "UnregisteredBuffer",
    "WindowTooSmall",
    "available",
    "commands",
    "libfabric_version",
    "open_fabric_transport",
]
