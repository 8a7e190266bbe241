"""Key schema and namespaces.

A hit is only safe when everything that shapes the KV bytes matches, so the
namespace is a fingerprint of model name/revision, adapters, tokenizer, KV dtype,
KV shapes and memory format, TP/PP world size and rank, chunk size and our wire
format version; the tenant is a separate, readable path segment so that a Valkey
ACL user can be confined to ``~<prefix>:<tenant>:*``.

Layout (see docs/keys.md)::

    <prefix>:<tenant>:<namespace>:c:{<chunk id>}   chunk value (header + payload)
    <prefix>:<tenant>:<namespace>:t:{<chunk id>}   tier marker (lower tiers hold it)

The hash tag is the chunk id alone: a chunk's value and marker share a Cluster
slot (one ``EXISTS value marker`` answers "in any tier?"), while the chunks of
one namespace spread over every shard.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Mapping, NamedTuple, Sequence

from .errors import ConfigError

FORMAT_VERSION = 2  # 2: ids and digests keyed per tenant (tenant_key)
DATA = "c"
TIER_MARKER = "t"

# The grammar of every key segment (docs/security.md, "Object storage keys"). Segments
# reach object keys and file names, so none may hold '/', ':', '{', '}', glob characters,
# or be '.'/'..': a prefix, tenant or namespace is 1-64 of [A-Za-z0-9_.-] starting with a
# letter or digit; a chunk id is lowercase hex.
SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # use with .match
CHUNK_ID_RE = re.compile(r"[0-9a-f]{1,64}\Z")
_DATA_KEY_RE = re.compile(
    rb"([A-Za-z0-9][A-Za-z0-9_.-]{0,63}):([A-Za-z0-9][A-Za-z0-9_.-]{0,63}):([A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
    rb":" + DATA.encode() + rb":\{([0-9a-f]{1,64})\}"
)
MAX_KEY_BYTES = 256  # longer than any key of the schema


class DataKey(NamedTuple):
    """The segments of a chunk's data key, each checked against its grammar."""

    prefix: str
    tenant: str
    digest: str
    chunk_id: str


def parse_data_key(key: bytes) -> DataKey:
    """``<prefix>:<tenant>:<namespace>:c:{<chunk id>}`` -> its segments; ValueError for
    anything else (a '/', '..', glob character or non-hex id in any segment included)."""
    m = _DATA_KEY_RE.fullmatch(key) if isinstance(key, bytes) and len(key) <= MAX_KEY_BYTES else None
    if m is None:
        raise ValueError(f"not a data key of the key schema: {bytes(key)[:80]!r}")
    return DataKey(*(g.decode() for g in m.groups()))


def tenant_key(prefix: str, tenant: str, secret: bytes | None = None) -> bytes:
    """The 32-byte key every id of one tenant is derived with (docs/keys.md, "Key derivation").

    With the tenant's secret, nobody without it can compute the tenant's chunk ids or
    namespace digests: key names reveal nothing, and another tenant cannot probe whether a
    guessable prompt is cached. Without one, ids still differ per tenant (equal prompts of
    two tenants never share a key) but anyone who knows the tenant's name can compute them."""
    k = hashlib.blake2b(secret, digest_size=32, person=b"lmcv-secret").digest() if secret else b""
    return hashlib.blake2b(f"{prefix}:{tenant}".encode(), digest_size=32, key=k, person=b"lmcv-tenant").digest()


@lru_cache(maxsize=256)
def _keyed_hashers(key: bytes) -> tuple[Any, Any]:
    """BLAKE2b states for chunk ids and key digests, keyed once and copied per call (cheaper
    than keying every call). Kept here, not on the Namespace, which stays picklable."""
    return (hashlib.blake2b(digest_size=16, key=key, person=b"lmcv-chunk"),
            hashlib.blake2b(digest_size=16, key=key, person=b"lmcv-key"))


def fingerprint(fields: Mapping[str, Any], key: bytes = b"") -> str:
    """A stable 16-byte hex digest of the fields that decide KV compatibility, keyed with
    the tenant's key (:func:`tenant_key`)."""
    canonical = json.dumps({**fields, "format_version": FORMAT_VERSION}, sort_keys=True, default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=16, key=key, person=b"lmcv-ns").hexdigest()


@dataclass(frozen=True)
class Namespace:
    """Where one model/layout's chunks live, for one tenant. ``secret``: the tenant's
    key-derivation secret (``Settings.tenant_secret``); never shown."""

    prefix: str
    tenant: str
    digest: str  # hex fingerprint (or a validated override)
    secret: bytes | None = field(default=None, repr=False)

    @property
    def base(self) -> str:
        return f"{self.prefix}:{self.tenant}:{self.digest}"

    @property
    def digest_bytes(self) -> bytes:
        """16 bytes stored in each chunk header; a chunk of another namespace is foreign."""
        return hashlib.blake2b(self.base.encode(), digest_size=16).digest()

    @cached_property
    def _key(self) -> bytes:
        return tenant_key(self.prefix, self.tenant, self.secret)

    @property
    def _hashers(self) -> tuple[Any, Any]:
        return _keyed_hashers(self._key)

    @cached_property
    def _data_head(self) -> str:
        return f"{self.prefix}:{self.tenant}:{self.digest}:{DATA}:{{"

    @cached_property
    def _marker_head(self) -> str:
        return f"{self.prefix}:{self.tenant}:{self.digest}:{TIER_MARKER}:{{"

    def data_key(self, chunk_id: str) -> bytes:
        return f"{self._data_head}{chunk_id}}}".encode()

    def data_keys(self, chunk_ids: Sequence[str]) -> list[bytes]:
        """:meth:`data_key` of each id (a lookup's hot path: see :func:`_keys_of`)."""
        return _keys_of(self._data_head, chunk_ids)

    def marker_keys(self, chunk_ids: Sequence[str]) -> list[bytes]:
        return _keys_of(self._marker_head, chunk_ids)

    def chunk_id(self, key_string: str) -> str:
        """The chunk id of an engine's key string in this namespace. Every adapter derives ids
        here and nowhere else: a keyed hash with the tenant's key, so equal key strings of two
        tenants never share an id, and without the tenant's secret nobody can compute one."""
        h = self._hashers[0].copy()
        h.update(key_string.encode())
        return h.hexdigest()

    def key_digest(self, key_string: str) -> bytes:
        """16 bytes stored in the chunk header to detect a value stored under the wrong key
        (keyed too: a header read elsewhere does not confirm a guessed prompt)."""
        h = self._hashers[1].copy()
        h.update(key_string.encode())
        return h.digest()

    def marker_key(self, chunk_id: str) -> bytes:
        return f"{self._marker_head}{chunk_id}}}".encode()

    def data_pattern(self) -> bytes:
        return f"{self.base}:{DATA}:*".encode()

    def chunk_id_of(self, key: bytes) -> str:
        head = f"{self.base}:{DATA}:{{".encode()
        if not (key.startswith(head) and key.endswith(b"}")):
            raise ValueError(f"key {key!r} is not a data key of namespace {self.base}")
        return key[len(head):-1].decode()

    @property
    def tenant_pattern(self) -> str:
        """The ACL key pattern that confines a user to this tenant."""
        return f"~{self.prefix}:{self.tenant}:*"


class ChunkIds:
    """Chunk ids of an engine's key strings in one namespace, remembered (at most
    ``max_entries``, then forgotten all at once).

    An engine asks about the same keys again and again (every request looks its whole prefix
    up, then gets or puts those chunks), and an id costs a keyed hash: a dictionary hit is a
    fraction of that. Holds nothing secret beyond what key names show.
    """

    def __init__(self, namespace: Namespace, max_entries: int = 1 << 16) -> None:
        self.namespace = namespace
        self._ids: dict[str, str] = {}
        self._max = max_entries

    def of(self, key_string: str) -> str:
        c = self._ids.get(key_string)
        if c is None:
            if len(self._ids) >= self._max:
                self._ids.clear()
            c = self._ids[key_string] = self.namespace.chunk_id(key_string)
        return c

    def many(self, key_strings: list[str]) -> list[str]:
        ids: list[Any] = list(map(self._ids.get, key_strings))
        if None in ids:
            for i, c in enumerate(ids):
                if c is None:
                    ids[i] = self.of(key_strings[i])
        return ids


def _keys_of(head: str, chunk_ids: Sequence[str]) -> list[bytes]:
    """``head + id + "}"`` of each id, as bytes: one join, one encode and one split for the
    whole lookup instead of a format and an encode per id. The separator cannot be in an id
    (ids are hex digests; the count check catches any id that is not)."""
    if len(chunk_ids) < 8:
        return [f"{head}{c}}}".encode() for c in chunk_ids]
    joined = head + ("}\n" + head).join(chunk_ids) + "}"
    keys = joined.encode().split(b"\n")
    if len(keys) != len(chunk_ids):
        return [f"{head}{c}}}".encode() for c in chunk_ids]
    return keys


def make_namespace(prefix: str, tenant: str, fields: Mapping[str, Any], override: str | None = None,
                   secret: bytes | None = None) -> Namespace:
    if ":" in tenant or not tenant:
        raise ConfigError("tenant", "a non-empty name without ':'", tenant)
    digest = override or fingerprint(fields, tenant_key(prefix, tenant, secret))
    return Namespace(prefix=prefix, tenant=tenant, digest=digest, secret=secret)
