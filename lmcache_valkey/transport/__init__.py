"""Transports: RESP over TCP/TLS/Unix sockets, and libfabric RMA."""
