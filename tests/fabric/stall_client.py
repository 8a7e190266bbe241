"""Helper process for test_fabric_deadline: starts an RMA GET of a large value into its own
registered buffer and stops itself (SIGSTOP) right after sending the command, so the
server's transfer stalls on a target that no longer makes progress."""

import os
import signal
import sys

import valkey

from lmcache_valkey.transport.fabric import FabricEndpoint

port, size, timeout_ms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ep = FabricEndpoint("tcp;ofi_rxm")
buf = bytearray(size)
region = ep.register_buffer(buf)
c = valkey.Valkey(port=port, single_connection_client=True)
c.execute_command("BLOB.RDMA_HELLO", ep.name.hex())
conn = c.connection
conn.send_command("BLOB.RDMA_GET", "big", region.key, region.remote_addr(region.addr), size, "TIMEOUT", timeout_ms)
print("sent", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
print(conn.read_response(), flush=True)
