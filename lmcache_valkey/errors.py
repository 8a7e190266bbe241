"""Typed errors of lmcache_valkey.

Every layer raises these and nothing else across its boundary; third-party
exceptions (valkey-py, aiobotocore, cffi) are mapped to them in the one module
that imports that library. A cache *miss* is never an exception: APIs return
``None``. Exceptions are for what a caller may want to count or act on.
"""

from __future__ import annotations

import re
from typing import Callable


class LmcacheValkeyError(Exception):
    """Base class of every error this package raises."""


# A key whose name says it holds a secret, or a file or variable holding one -- spelt right
# or not quite ("password_file", "LMCACHE_VALKEY_PASSWORD", "url?passwrd", "tenant_secret").
# What was given for it is never quoted: a password typed into the wrong key is a common slip.
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential", re.IGNORECASE)
REDACTED = "<redacted>"


class ConfigError(LmcacheValkeyError, ValueError):
    """A setting is missing, unknown or malformed. Raised at start-up only.

    The one place that decides which given values an error may quote (its message, ``got``,
    every log line and ``--json`` field made from it): none for a key whose name says secret
    (``_SECRET_KEY``), and none for a key nobody knows (:class:`UnknownSetting`), which may
    be a misspelt secret key. Values that hold a URL are redacted by whoever quotes them
    (``config._redact_url``)."""

    def __init__(self, key: str, expected: str, got: object = None) -> None:
        if got is not None and _SECRET_KEY.search(key) and not (isinstance(got, str) and got.startswith(REDACTED[:-1])):
            got = REDACTED
        self.key = key
        self.expected = expected
        self.got = got
        shown = "" if got is None else f", got {got!r}"
        super().__init__(f"invalid setting {key!r}: expected {expected}{shown}")

    def renamed(self, key: str) -> "ConfigError":
        """The same refusal naming ``key`` (with the prefix or flag the user wrote): same
        class, so an unknown key's value stays unquoted."""
        return type(self)(key, self.expected, self.got)


class UnknownSetting(ConfigError):
    """A key that no settings table knows. Never quotes what was given for it: a misspelt
    ``password`` ("passwrd", "pasword", ``url?passwrd=...``) holds the password."""

    def __init__(self, key: str, expected: str, got: object = None) -> None:
        super().__init__(key, expected)  # got: dropped, whatever it was


class TransportError(LmcacheValkeyError):
    """An operation against a server failed; the chunk is a miss or the put failed."""

    cause = "error"  # short label used by metrics


class ConnectionLost(TransportError):
    """The connection broke (refused, reset, closed mid-reply).

    ``unanswered``: the server closed or reset the connection before sending a single byte
    of the round trip the request went out in (an idle connection the server, a proxy or a
    NAT dropped at that very moment looks like this). The request may or may not have run;
    one that is idempotent may be sent again.
    """

    cause = "connection"

    def __init__(self, *args: object, unanswered: bool = False) -> None:
        super().__init__(*args)
        self.unanswered = unanswered


class DeadlineExceeded(TransportError, TimeoutError):
    """The operation did not finish before its deadline."""

    cause = "deadline"


class NotReplicated(TransportError):
    """``put_replicas``: the primary stored the value, but fewer replicas than asked had it
    when WAIT answered (within the put's deadline). The put is not acknowledged; the value
    stays on the primary (a later read may still hit it)."""

    cause = "replicas"

    def __init__(self, wanted: int, got: int) -> None:
        super().__init__(f"{got} of {wanted} replicas acknowledged the write")
        self.wanted, self.got = wanted, got


class ServerError(TransportError):
    """The server answered with an error reply (``-ERR ...``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.prefix = message.split(" ", 1)[0] if message else ""


class AuthError(ServerError):
    """NOAUTH, WRONGPASS or NOPERM: credentials or ACL refuse the operation."""

    cause = "acl"


class OutOfMemory(ServerError):
    """The server is at ``maxmemory`` and refused a write (OOM)."""

    cause = "oom"


class TryAgain(ServerError):
    """TRYAGAIN: a multi-key command met a slot being migrated (Cluster); retry shortly."""


class ReadOnly(ServerError):
    """READONLY: the node is a replica now (a failover): writes go to the new primary."""


class Loading(ServerError):
    """LOADING: the server is loading its dataset after a restart; it answers soon."""

    cause = "connection"


class ProtocolError(TransportError):
    """The byte stream is not valid RESP; the connection must be dropped."""

    cause = "protocol"


class MissingExtra(LmcacheValkeyError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra to install (``pip install 'lmcache-valkey[<extra>]'``)."""

    def __init__(self, feature: str, module: str, extra: str) -> None:
        self.feature, self.module, self.extra = feature, module, extra
        super().__init__(f"{feature} needs {module}, which is not installed: "
                         f"pip install 'lmcache-valkey[{extra}]'")


class FabricUnavailable(LmcacheValkeyError):
    """libfabric (or the requested provider/endpoint) cannot be used here."""


class CorruptChunk(LmcacheValkeyError):
    """A stored value failed validation (bad magic, CRC, length, or a foreign key).

    ``reason`` is one of ``truncated``, ``crc``, ``foreign``, ``oversized``,
    ``format``, ``layout``, ``meta`` and is used as the metrics label of the counted miss.
    ``format`` and ``layout`` values may be valid for other readers and stay; the others
    can never be served and are deleted.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


# Valkey Cluster's fixed number of hash slots (a MOVED/ASK names one of them).
CLUSTER_SLOTS = 16384
_HOST_MAX = 255


class Redirect(ServerError):
    """``MOVED <slot> <host>:<port>`` or ``ASK ...``: the slot is served elsewhere.

    Parsed once, when the reply is read (:meth:`parse`); a malformed one is a
    :class:`ProtocolError` instead, so nothing downstream indexes a slot table
    with a number a server made up. An empty host means the node that answered.
    """

    def __init__(self, message: str, kind: str, slot: int, host: str, port: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.slot = slot
        self.host = host
        self.port = port

    @classmethod
    def parse(cls, message: str) -> "Redirect | ProtocolError":
        parts = message.split(" ")
        if len(parts) >= 3 and parts[1].isdigit() and len(parts[1]) <= 5:
            slot = int(parts[1])
            host, sep, port = parts[2].rpartition(":")
            if (sep and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536 and slot < CLUSTER_SLOTS
                    and len(host) <= _HOST_MAX and host.isascii() and host.isprintable()):
                return cls(message, parts[0], slot, host, int(port))
        return ProtocolError(f"malformed redirection {message[:80]!r}")


# Error-reply prefixes mapped to their typed error, in the style of valkey-py's parser
# table: the one place a server's error text becomes a class (the fabric endpoint's own
# codes add theirs in transport/fabric/commands.py).
SERVER_ERROR_PREFIXES: dict[str, Callable[[str], TransportError]] = {
    "NOAUTH": AuthError,
    "WRONGPASS": AuthError,
    "NOPERM": AuthError,
    "OOM": OutOfMemory,
    "MOVED": Redirect.parse,
    "ASK": Redirect.parse,
    "TRYAGAIN": TryAgain,
    "READONLY": ReadOnly,
    "LOADING": Loading,
}


def server_error(message: str) -> TransportError:
    """The typed error for an error reply's message: a :class:`ServerError` (subclass), or a
    :class:`ProtocolError` when a structured error (MOVED, ASK) is malformed."""
    prefix = message.split(" ", 1)[0]
    return SERVER_ERROR_PREFIXES.get(prefix, ServerError)(message)
