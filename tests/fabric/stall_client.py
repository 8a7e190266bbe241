"""Helper process for the stalled-target tests: starts an RMA GET of a large value into its own
registered buffer and stops itself (SIGSTOP) right after sending the command, so the
server's transfer stalls on a target that no longer makes progress.

``warm <key>`` (optional): first read ``<key>`` (a small value) by RMA, so the provider
connection to this process is up and the server posts the large GET's operations before
they stall (without it, the server cannot even connect and posts nothing).

``set`` (optional, last): the stalled command is an RMA SET of ``big`` read from this buffer
instead; on SIGCONT the reply (or the error's text) is printed."""

import os
import signal
import sys
from pathlib import Path

import valkey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package
from lmcache_valkey.transport.fabric import FabricEndpoint  # noqa: E402
from support.fabric_peer import proven_hello  # noqa: E402

port, size, timeout_ms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
warm = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "warm" else None
is_set = sys.argv[-1] == "set"
ep = FabricEndpoint("tcp;ofi_rxm")
buf = bytearray(size)
region = ep.register_buffer(buf)
c = valkey.Valkey(port=port, single_connection_client=True)
proven_hello(c, ep, region, buf)  # the server requires it (require_proof yes, the default)
if warm is not None:
    c.execute_command("BLOB.RDMA_GET", warm, region.key, region.remote_addr(region.addr), size)
conn = c.connection
if is_set:
    conn.send_command("BLOB.RDMA_SET", "big", size, region.key, region.remote_addr(region.addr), size,
                      "TIMEOUT", timeout_ms)
else:
    conn.send_command("BLOB.RDMA_GET", "big", region.key, region.remote_addr(region.addr), size, "TIMEOUT", timeout_ms)
print("sent", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
try:
    print(conn.read_response(), flush=True)
except valkey.exceptions.ResponseError as e:
    print(e, flush=True)
