"""A minimal RESP connection (TLS optional) that returns every reply as it came, errors
included: for tests that check a server's replies against a published command reference."""

from __future__ import annotations

import socket
import ssl
from typing import Any

from lmcache_valkey.errors import ServerError
from lmcache_valkey.transport.resp.parser import ReplyParser, encode_command


class Conn:
    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        sock = socket.create_connection((host, port), timeout=30)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls else sock
        self._out: list[Any] = []
        self._parser = ReplyParser(self._out.append)

    def __call__(self, *args: Any) -> Any:
        self._parser.push_sink(None, 64 << 20)  # any reply up to 64 MiB
        self.sock.sendall(encode_command(args))
        while not self._out:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            self._parser.feed(data)
        return self._out.pop(0)

    def ok(self, *args: Any) -> Any:
        r = self(*args)
        if isinstance(r, ServerError):
            raise r
        return r

    def close(self) -> None:
        self.sock.close()


def is_error(reply: Any, *starts: str) -> bool:
    return isinstance(reply, ServerError) and (not starts or reply.message.startswith(starts))
