"""tierd's ACL line (issue 28, item 2): nothing that lists other tenants' key names or can
block the server. Every verb the server knows and the line does not name is run as tierd's
user against a real Valkey, and refused."""

from __future__ import annotations

import socket
import time

import pytest

from lmcache_valkey import acl
from support.acl_lines import setuser
from support.servers import ValkeyServer

pytestmark = pytest.mark.timeout(120)

OWN, OTHER = "lmcv:team-a:ns:c:{01}", "lmcv:team-b:ns:c:{01}"
# Commands ACL rules never gate (the server answers them before or without the ACL check).
UNGATED = {"auth", "hello", "quit", "reset"}


def _verbs(server: ValkeyServer) -> dict[str, int]:
    """Every command and sub-command the server knows (``name`` or ``name|sub``) -> arity."""
    out: dict[str, int] = {}
    for entry in server.cmd("COMMAND"):
        name, arity = entry[0].decode().lower(), int(entry[1])
        subs = entry[9] if len(entry) > 9 else []
        if subs:
            for sub in subs:
                out[sub[0].decode().lower()] = int(sub[1])
        else:
            out[name] = arity
    return out


def _run(server: ValkeyServer, user: str, args: tuple[str, ...]):
    try:
        return server.cmd(*args, auth=(user, "pw"))
    except Exception as e:  # noqa: BLE001 - error replies come back as exceptions
        return e


def _refused(r) -> bool:
    return isinstance(r, Exception) and ("NOPERM" in str(r) or "no permissions" in str(r))


def test_tierd_line_refuses_every_verb_it_does_not_name():
    line = acl.tierd_line("lmcv-tierd", "team-a")
    allowed = set(acl.tierd_commands())
    with ValkeyServer(args=["--enable-debug-command", "yes", "--enable-module-command", "yes"]) as server:
        server.cmd("SET", OTHER, "theirs")
        user = setuser(server, line, "pw")
        verbs = _verbs(server)
        assert len(verbs) > 200 and {"scan", "keys", "randomkey", "eval", "fcall", "function|load"} <= set(verbs)
        ran, wrong = 0, []
        for verb, arity in sorted(verbs.items()):
            if verb in allowed or verb in UNGATED:
                continue
            # enough arguments for the arity check (it runs before the ACL's), all of them a
            # key of tierd's own tenant: a refusal is the command's, not the key's
            words = verb.split("|")
            extra = max(abs(arity) - len(words), 0)
            r = _run(server, user, (*words, *([OWN] * extra)))
            ran += 1
            if not _refused(r):
                wrong.append(f"{verb}: {r!r}")
        assert not wrong, "tierd's line lets through:\n" + "\n".join(wrong)
        assert ran > 200
        assert server.cmd("GET", OTHER) == b"theirs"


def test_tierd_can_neither_list_other_tenants_nor_block_the_server():
    with ValkeyServer() as server:
        for i in range(50):
            server.cmd("SET", f"lmcv:team-b:ns:c:{{{i:02d}}}", "x")
        user = setuser(server, acl.tierd_line("lmcv-tierd", "team-a"), "pw")
        for args in (("SCAN", "0", "COUNT", "1000"), ("SCAN", "0", "MATCH", "lmcv:team-a:*"), ("KEYS", "*"),
                     ("RANDOMKEY",), ("EVAL", "local i=0 while true do i=i+1 end", "0"),
                     ("EVAL_RO", "return 1", "0"), ("EVALSHA", "0" * 40, "0"),
                     ("FUNCTION", "LOAD", "#!lua name=x\nserver.register_function('f', function() while true do end end)"),
                     ("FCALL", "f", "0"), ("SCRIPT", "LOAD", "return 1"), ("SSCAN", OTHER, "0"), ("ZSCAN", OTHER, "0")):
            r = _run(server, user, args)
            assert _refused(r), (args, r)
        # ... and the server answers everyone (no script of tierd's runs)
        assert server.cmd("PING") in (b"PONG", "PONG", True)
        # tierd's own index is its to read (a key inside its pattern), another tenant's is not
        own = "lmcv:team-a:_tierd:ram"
        assert _run(server, user, ("ZADD", own, "1", OWN)) == 1
        assert _run(server, user, ("ZRANGE", own, "0", "999")) == [OWN.encode()]
        assert _refused(_run(server, user, ("ZRANGE", "lmcv:team-b:_tierd:ram", "0", "999")))
        assert _refused(_run(server, user, ("ZADD", "lmcv:team-b:_tierd:ram", "1", OTHER)))


def test_a_reply_transaction_cannot_reach_another_tenant():
    """MULTI/EXEC (a reply's RPUSH + PEXPIRE) runs each queued command under the same ACL."""
    with ValkeyServer() as server:
        user = setuser(server, acl.tierd_line("lmcv-tierd", "team-a"), "pw")
        with socket.create_connection((server.host, server.port)) as s:
            s.sendall(f"AUTH {user} pw\r\nMULTI\r\nRPUSH lmcv:team-b:_tierd:rep:x v\r\nEXEC\r\n".encode())
            time.sleep(0.3)
            data = s.recv(1 << 16)
        assert b"NOPERM" in data or b"no permissions" in data
        assert server.cmd("EXISTS", "lmcv:team-b:_tierd:rep:x") == 0
