"""The test harness itself: a module server whose port was taken between picking and binding
(the fabric endpoint it loads first may be handed that very port) starts on another one."""

from __future__ import annotations

import socket


def test_a_module_server_whose_port_is_taken_starts_on_another(start_server) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        srv = start_server(port=taken)
        assert srv.port != taken
        assert srv.client().ping()
