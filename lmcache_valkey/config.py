"""Settings: parsed and validated once, at start-up, into frozen dataclasses.

Sources, in order of precedence: LMCache ``extra_config``
(``remote_storage_plugin.<name>.<key>``), then the query string of ``url``, then
environment variables for secrets (``LMCACHE_VALKEY_USERNAME``,
``LMCACHE_VALKEY_PASSWORD``, ``LMCACHE_VALKEY_PASSWORD_FILE``,
``LMCACHE_VALKEY_TENANT_SECRET``, ``LMCACHE_VALKEY_TENANT_SECRET_FILE``, and
``LMCACHE_VALKEY_REQUIRE_TENANT_SECRET`` for the opt-out below). Every bad or
unknown key raises :class:`~lmcache_valkey.errors.ConfigError` naming the key and
the expected form. Nothing downstream re-parses strings.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import ConfigError, UnknownSetting
from .keys import SEGMENT_RE

log = logging.getLogger(__name__)

PLUGIN_PREFIX = "remote_storage_plugin."
# Keys LMCache itself reads from the same extra_config namespace.
LMCACHE_OWN_KEYS = frozenset({"module_path", "class_name"})

_SCHEMES_PLAIN = {"valkey", "redis"}
_SCHEMES_TLS = {"valkeys", "rediss"}


@dataclass(frozen=True)
class Node:
    """One server address: TCP ``host:port`` or a Unix socket ``path``."""

    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def name(self) -> str:
        return self.path if self.path else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TLSSettings:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    server_name: str | None = None


@dataclass(frozen=True)
class FabricSettings:
    provider: str = ""  # "" = choose per environment (efa if present, else tcp;ofi_rxm)
    bind_addr: str = ""  # "" = the address used to reach Valkey
    scratch_bytes: int = 1 << 20
    # The server module's command set: valkey-large-object's BLOB.* (our module's own), or
    # Momento's DMA.* (values are plain strings, shared with RESP workers).
    dialect: str = "large-object"
    # Registered memory a one-region dialect (dma) moves whole values through when they are
    # not one registered range (the store's header before LMCache's payload).
    bounce_bytes: int = 64 << 20


@dataclass(frozen=True)
class Settings:
    """Everything the store needs, validated."""

    nodes: tuple[Node, ...] = (Node("127.0.0.1", 6379),)
    tls: TLSSettings | None = None
    db: int = 0
    cluster: str = "auto"  # auto | yes | no
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tenant: str = "default"
    namespace: str | None = None  # overrides the computed fingerprint
    connect_timeout_s: float = 2.0
    op_timeout_s: float = 5.0
    lookup_timeout_s: float = 1.0
    connections_per_node: int = 4
    # How a standalone server is asked a prefix lookup (transport/resp/prefix.py): "counts",
    # EXISTS per block of 16 keys (a twentieth of the server's commands; a partial hit takes
    # two round trips), or "per_key", one EXISTS per key in one round trip.
    prefix_lookup: str = "counts"
    ttl_s: float | None = None
    # Durability of a put (tcp transport): 0 acknowledges a chunk once the primary holds it
    # (replication is asynchronous: a failover can lose it); N > 0 sends WAIT N after each
    # SET on the same connection and counts the put as stored only once N replicas have it.
    put_replicas: int = 0
    max_chunk_bytes: int = 256 << 20
    transport: str = "auto"  # auto | tcp | fabric (alias rdma) | blob-tcp
    fabric: FabricSettings = field(default_factory=FabricSettings)
    key_prefix: str = "lmcv"
    # Anything else that changes the KV bytes but LMCache does not know about:
    # a model revision, LoRA adapters, a tokenizer hash. Part of the namespace.
    model_revision: str = ""
    # The tenant's key-derivation secret (keys.tenant_key): chunk ids and namespace digests
    # are keyed with it, so nobody without it can compute or probe them. Never shown.
    tenant_secret: bytes | None = field(default=None, repr=False)
    # A worker of a tenant other than "default" refuses to derive chunk ids without
    # tenant_secret (check_tenant_secret); False is the explicit, documented weaker mode
    # (docs/security.md, "Tenant secrets").
    require_tenant_secret: bool = True

    @property
    def url_for_humans(self) -> str:
        scheme = "valkeys" if self.tls else "valkey"
        return f"{scheme}://" + ",".join(n.name for n in self.nodes)


# --- the settings vocabulary --------------------------------------------------------------
# One parser per kind of value, shared by every settings table of the package (core settings
# here, tiering in tiering/settings.py, each adapter's own keys): a boolean, a duration or a
# size means the same in every key. Each returns the typed value or raises
# ConfigError(key, what was expected, what was given).

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
MAX_SECONDS = 24 * 3600.0  # a duration longer than a day is a typo (ms for s) unless a key says otherwise


def parse_str(key: str, v: Any) -> str:
    """Any string (may be empty)."""
    if isinstance(v, str):
        return v
    raise ConfigError(key, "a string", v)


def parse_opt_str(key: str, v: Any) -> str | None:
    """A non-empty string, or None for a missing/empty value."""
    if v in (None, ""):
        return None
    if isinstance(v, str):
        return v
    raise ConfigError(key, "a string", v)


def _as_secret(key: str, v: Any) -> str:
    if isinstance(v, str):
        return v
    raise ConfigError(key, "a string (quote it in YAML)", "<redacted>")


def parse_bool(key: str, v: Any) -> bool:
    """``true``/``false``, ``yes``/``no``, ``on``/``off``, ``1``/``0`` (a YAML boolean, a string, or 0/1)."""
    if isinstance(v, bool):
        return v
    if type(v) is int and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise ConfigError(key, "a boolean (true/false)", v)


def parse_int(key: str, v: Any, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` (an int, an integral float, or its decimal string)."""
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(key, f"an integer in [{lo}, {hi}]", v) from None
    if not lo <= i <= hi:
        raise ConfigError(key, f"an integer in [{lo}, {hi}]", v)
    return i


def parse_number(key: str, v: Any, lo: float, hi: float, *, lo_included: bool = False,
                 what: str = "a number") -> float:
    """A finite number in ``(lo, hi]`` (``[lo, hi]`` with ``lo_included``)."""
    try:
        if isinstance(v, bool):
            raise ValueError
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(key, what, v) from None
    low_ok = f >= lo if lo_included else f > lo
    if not (low_ok and f <= hi):  # NaN fails both
        bound = f"{'>=' if lo_included else '>'} {lo:g} and at most {hi:g}"
        raise ConfigError(key, f"{what} {bound}", v)
    return f


def parse_seconds(key: str, v: Any, *, allow_zero: bool = False, maximum: float = MAX_SECONDS) -> float:
    """A duration in seconds: positive (or 0 with ``allow_zero``), finite, at most ``maximum``."""
    return parse_number(key, v, 0.0, maximum, lo_included=allow_zero, what="a number of seconds")


def parse_opt_seconds(key: str, v: Any, *, maximum: float = MAX_SECONDS) -> float | None:
    """A duration, or None for ``none``/``off``/empty (the feature is off)."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "off")):
        return None
    return parse_seconds(key, v, maximum=maximum)


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(key: str, v: Any) -> int:
    """A positive byte count: an int, or a string like ``512MiB`` / ``1G`` / ``4096``."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    if isinstance(v, str):
        m = _SIZE_RE.match(v)
        if m:
            unit = (m.group(2) or "").upper()[:1]
            n = int(m.group(1)) * _SIZE_UNITS[unit]
            if n > 0:
                return n
    raise ConfigError(key, "a positive byte count (e.g. 536870912 or '512MiB')", v)


def format_size(n: int) -> str:
    """A byte count as people read it, in the units :func:`parse_size` accepts: ``512 B``,
    ``4.0 MiB``, ``1.5 TiB``."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def parse_choice(key: str, v: Any, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (case-insensitive)."""
    if isinstance(v, str) and v.strip().lower() in choices:
        return v.strip().lower()
    raise ConfigError(key, "one of " + "|".join(choices), v)


def _as_file(key: str, v: Any) -> str:
    path = parse_str(key, v)
    if not os.path.isfile(path):
        raise ConfigError(key, "the path of a readable file", v)
    return path


def _redact_url(url: object) -> object:
    """The URL without its ``user:password@`` and without its query string (which may carry
    ``password=`` or a misspelt key holding one), for error messages and logs."""
    if not isinstance(url, str):
        return url
    scheme, sep, rest = url.rpartition("://") if "://" in url else ("", "", url)
    if "@" in rest:  # a password may hold '@', '?' or '/': keep only what follows the last '@'
        rest = "***@" + rest.rsplit("@", 1)[1]
    host, q, _ = rest.partition("?")
    return f"{scheme}{sep}{host}" + ("?***" if q else "")


def parse_url(url: str, key: str = "url") -> tuple[tuple[Node, ...], bool, int, dict[str, str], str | None, str | None]:
    """Parse ``valkey[s]://[user:pass@]host:port[,host:port...][/db][?k=v]`` or ``unix:///path``.

    Returns (nodes, tls, db, query, username, password).
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(key, "a URL like valkey://host:6379, valkeys://host:6380 or unix:///path/valkey.sock", _redact_url(url))
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if "@" in rest:
        # A URL with credentials: no error may quote a fragment of it (a password with an
        # unencoded '?', '/' or ':' would land in the host, port or query parts).
        try:
            return _parse_url(scheme, rest, key)
        except ConfigError as e:
            raise ConfigError(e.key.split("?", 1)[0], e.expected, _redact_url(url)) from None
    return _parse_url(scheme, rest, key)


def _split_userinfo(rest: str) -> tuple[str | None, str]:
    """``user:pass@hosts...`` -> (``user:pass``, ``hosts...``). The userinfo runs to the last
    '@' that a host list follows, so a password may hold '@', '?', '/' or '#' unencoded; an
    '@' inside a query (``?tls_ca_file=/a@b/ca.pem`` after hosts that parse) is not one."""
    for at in reversed([i for i, c in enumerate(rest) if c == "@"]):
        if _HOSTS_RE.match(re.split(r"[/?]", rest[at + 1 :], maxsplit=1)[0]) and not _in_query(rest, at):
            return rest[:at], rest[at + 1 :]
    return None, rest


def _in_query(rest: str, at: int) -> bool:
    q = rest.find("?", 0, at)
    if q == -1 or "=" not in rest[q:at]:
        return False
    hosts = rest[rest.rfind("@", 0, q) + 1 : q].split("/", 1)[0]
    return bool(_HOSTS_RE.match(hosts))


_HOSTS_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:\d{1,5})?(,\s*(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:\d{1,5})?)*,?$")


def _parse_url(scheme: str, rest: str, key: str) -> tuple[tuple[Node, ...], bool, int, dict[str, str], str | None, str | None]:
    cred, rest = _split_userinfo(rest) if scheme != "unix" else (None, rest)
    query: dict[str, str] = {}
    if "?" in rest:
        rest, qs = rest.split("?", 1)
        query = dict(parse_qsl(qs, keep_blank_values=True))
    if scheme == "unix":
        if not rest.startswith("/"):
            raise ConfigError(key, "unix:///absolute/path.sock", "unix://" + rest)
        return (Node(path=rest),), False, 0, query, None, None
    if scheme not in _SCHEMES_PLAIN | _SCHEMES_TLS:
        raise ConfigError(key, "scheme valkey://, valkeys://, redis://, rediss:// or unix://", scheme)
    username = password = None
    if cred is not None:
        if ":" in cred:
            u, p = cred.split(":", 1)
            username, password = (unquote(u) or None), unquote(p)
        else:
            password = unquote(cred)
    db = 0
    if "/" in rest:
        rest, dbs = rest.split("/", 1)
        if dbs:
            db = parse_int(f"{key} (database)", dbs, 0, 15)
    nodes = []
    for part in rest.split(","):
        part = part.strip()
        if not part:
            continue
        if not _HOSTS_RE.match(part):
            # Not quoted: a part that is no host may be a password whose '@' was forgotten.
            raise ConfigError(key, "host:port (a name or address, and a port; the part given is not one)")
        split = urlsplit("//" + part)
        try:
            port = 6379 if split.port is None else split.port
        except ValueError:
            raise ConfigError(key, "host:port with a port in 1..65535", part) from None
        if not 0 < port < 65536:
            raise ConfigError(key, "host:port with a port in 1..65535", part)
        if not split.hostname:
            raise ConfigError(key, "host:port", part)
        nodes.append(Node(split.hostname, port))
    if not nodes:
        raise ConfigError(key, "at least one host:port", rest)
    return tuple(nodes), scheme in _SCHEMES_TLS, db, query, username, password


def _read_password_file(key: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as e:
        raise ConfigError(key, f"a readable file ({e.strerror})", path) from None


# Transports: RESP strings (tcp), large objects by RDMA (fabric; "rdma" as ElastiCache names
# it) or inline over RESP (blob-tcp), or the best the server and host offer (auto).
TRANSPORTS = ("auto", "tcp", "fabric", "blob-tcp")
_TRANSPORT_ALIASES = {"rdma": "fabric"}


def _as_transport(key: str, value: Any) -> str:
    v = parse_str(key, value).strip().lower()
    return parse_choice(key, _TRANSPORT_ALIASES.get(v, v), TRANSPORTS)


def _as_cluster(key: str, v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return parse_choice(key, v, ("auto", "yes", "no"))


# key -> (field name, parser). Parsers get (key, raw) and return the typed value.
_SIMPLE: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "cluster": ("cluster", _as_cluster),
    "username": ("username", parse_str),
    "password": ("password", lambda k, v: _as_secret(k, v)),
    "tenant": ("tenant", lambda k, v: _check_tenant(k, parse_str(k, v))),
    "namespace": ("namespace", lambda k, v: _check_tenant(k, parse_str(k, v))),
    "connect_timeout_s": ("connect_timeout_s", parse_seconds),
    "op_timeout_s": ("op_timeout_s", parse_seconds),
    "lookup_timeout_s": ("lookup_timeout_s", parse_seconds),
    "connections_per_node": ("connections_per_node", lambda k, v: parse_int(k, v, 1, 64)),
    "prefix_lookup": ("prefix_lookup", lambda k, v: parse_choice(k, v, ("counts", "per_key"))),
    "put_replicas": ("put_replicas", lambda k, v: parse_int(k, v, 0, 16)),
    "ttl_s": ("ttl_s", lambda k, v: parse_seconds(k, v, allow_zero=True) or None),
    "max_chunk_bytes": ("max_chunk_bytes", parse_size),
    "transport": ("transport", lambda k, v: _as_transport(k, v)),
    "key_prefix": ("key_prefix", lambda k, v: _check_tenant(k, parse_str(k, v))),
    "model_revision": ("model_revision", parse_str),
    "require_tenant_secret": ("require_tenant_secret", parse_bool),
}
_TLS_KEYS = {"tls_ca_file", "tls_cert_file", "tls_key_file", "tls_verify", "tls_server_name", "tls"}
_FABRIC_KEYS = {"fabric_provider", "fabric_bind_addr", "fabric_scratch_bytes", "fabric_dialect", "fabric_bounce_bytes"}
FABRIC_DIALECTS = ("large-object", "dma")
KNOWN_KEYS = frozenset(_SIMPLE) | _TLS_KEYS | _FABRIC_KEYS | {"url", "password_file", "tenant_secret", "tenant_secret_file"}
TENANT_SECRET_MIN = 16  # bytes (e.g. `openssl rand -hex 32` gives 64)
TENANT_SECRET_MAX = 4096


def _tenant_secret(merged: Mapping[str, Any], env: Mapping[str, str]) -> bytes | None:
    """tenant_secret > tenant_secret_file > LMCACHE_VALKEY_TENANT_SECRET_FILE >
    LMCACHE_VALKEY_TENANT_SECRET. Checked here, once; errors never quote it."""
    sources = (("tenant_secret", merged.get("tenant_secret"), False),
               ("tenant_secret_file", merged.get("tenant_secret_file"), True),
               ("LMCACHE_VALKEY_TENANT_SECRET_FILE", env.get("LMCACHE_VALKEY_TENANT_SECRET_FILE"), True),
               ("LMCACHE_VALKEY_TENANT_SECRET", env.get("LMCACHE_VALKEY_TENANT_SECRET"), False))
    for key, value, is_file in sources:
        if value in (None, ""):
            continue
        if is_file:
            secret = _read_password_file(key, parse_str(key, value))
        else:
            secret = _as_secret(key, value).strip()
        n = len(secret.encode())
        if not TENANT_SECRET_MIN <= n <= TENANT_SECRET_MAX:
            raise ConfigError(key, f"a secret of {TENANT_SECRET_MIN} to {TENANT_SECRET_MAX} bytes "
                                   "(e.g. `openssl rand -hex 32`)", f"<redacted: {n} bytes>")
        return secret.encode()
    return None


# Every LMCACHE_VALKEY_* variable the package reads (here, checksum.py, transport/fabric/_build.py,
# integrations/lmcache/adapter.py). Another one set is most likely a typo of a secret's
# variable ("LMCACHE_VALKEY_PASWORD"): said once, by name, never with its value.
ENV_NAMES = frozenset({"LMCACHE_VALKEY_USERNAME", "LMCACHE_VALKEY_PASSWORD", "LMCACHE_VALKEY_PASSWORD_FILE",
                       "LMCACHE_VALKEY_TENANT_SECRET", "LMCACHE_VALKEY_TENANT_SECRET_FILE", "LMCACHE_VALKEY_CRC32C",
                       "LMCACHE_VALKEY_LIBFABRIC_PREFIX", "LMCACHE_VALKEY_PLUGIN_NAMES",
                       "LMCACHE_VALKEY_REQUIRE_TENANT_SECRET"})
_ENV_WARNED: set[str] = set()


def _warn_unknown_env(env: Mapping[str, str]) -> None:
    for name in sorted(k for k in env if k.startswith("LMCACHE_VALKEY_") and k not in ENV_NAMES):
        if name not in _ENV_WARNED:
            _ENV_WARNED.add(name)
            log.warning("environment variable %s is set but lmcache-valkey reads no such variable (a typo? it "
                        "reads %s); its value is ignored", name, ", ".join(sorted(ENV_NAMES)))


def _check_tenant(key: str, v: str) -> str:
    if not SEGMENT_RE.match(v):
        raise ConfigError(key, "1-64 characters of letters, digits, '_', '.', '-'", v)
    return v


_QUERY_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def settings_from_mapping(raw: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Settings:
    """Validate a flat mapping of plugin keys (without the ``remote_storage_plugin.<name>.`` prefix)."""
    env = os.environ if env is None else env
    _warn_unknown_env(env)
    unknown = sorted(k for k in raw if k not in KNOWN_KEYS and k not in LMCACHE_OWN_KEYS)
    if unknown:
        # (UnknownSetting quotes no value: a misspelt secret key, "pasword", holds the secret)
        raise UnknownSetting(unknown[0], "one of the known keys: " + ", ".join(sorted(KNOWN_KEYS)))
    values: dict[str, Any] = {}
    url_user = url_pass = None
    tls_on = False
    merged = dict(raw)
    if "url" in raw:
        nodes, tls_on, db, query, url_user, url_pass = parse_url(raw["url"])
        values.update(nodes=nodes, db=db)
        for qk, qv in query.items():  # explicit keys beat the URL's query string
            if qk not in KNOWN_KEYS or qk == "url":
                # The "key" may be part of a password with a '?' in it (after an '@', or with the
                # '@' forgotten): name only what looks like a key.
                if "@" in raw["url"] or not _QUERY_KEY_RE.fullmatch(qk):
                    raise ConfigError("url", "known settings in the query string", _redact_url(raw["url"]))
                raise UnknownSetting(f"url?{qk}", "a known setting in the query string")
            merged.setdefault(qk, qv)
    for k, (name, parse) in _SIMPLE.items():
        if k in merged and merged[k] is not None:
            values[name] = parse(k, merged[k])
    # Secrets: explicit key > URL userinfo > password file > environment.
    values.setdefault("username", url_user or env.get("LMCACHE_VALKEY_USERNAME") or None)
    if "password" not in values:
        pw_file = merged.get("password_file") or env.get("LMCACHE_VALKEY_PASSWORD_FILE")
        if url_pass is not None:
            values["password"] = url_pass
        elif pw_file:
            values["password"] = _read_password_file("password_file", parse_str("password_file", pw_file))
        elif env.get("LMCACHE_VALKEY_PASSWORD"):
            values["password"] = env["LMCACHE_VALKEY_PASSWORD"]
    values["tenant_secret"] = _tenant_secret(merged, env)
    if "require_tenant_secret" not in values and env.get("LMCACHE_VALKEY_REQUIRE_TENANT_SECRET"):
        values["require_tenant_secret"] = parse_bool("LMCACHE_VALKEY_REQUIRE_TENANT_SECRET",
                                                     env["LMCACHE_VALKEY_REQUIRE_TENANT_SECRET"])
    if "tls" in merged:
        tls_on = parse_bool("tls", merged["tls"]) or tls_on
    if tls_on or any(k in merged for k in _TLS_KEYS - {"tls"}):
        tls_on = True
        values["tls"] = TLSSettings(
            ca_file=_as_file("tls_ca_file", merged["tls_ca_file"]) if merged.get("tls_ca_file") else None,
            cert_file=_as_file("tls_cert_file", merged["tls_cert_file"]) if merged.get("tls_cert_file") else None,
            key_file=_as_file("tls_key_file", merged["tls_key_file"]) if merged.get("tls_key_file") else None,
            verify=parse_bool("tls_verify", merged.get("tls_verify", True)),
            server_name=parse_str("tls_server_name", merged["tls_server_name"]) if merged.get("tls_server_name") else None,
        )
        if bool(values["tls"].cert_file) != bool(values["tls"].key_file):
            raise ConfigError("tls_cert_file", "tls_cert_file and tls_key_file given together (client certificate)")
    if any(k in merged for k in _FABRIC_KEYS):
        values["fabric"] = FabricSettings(
            provider=parse_str("fabric_provider", merged.get("fabric_provider", "")),
            bind_addr=parse_str("fabric_bind_addr", merged.get("fabric_bind_addr", "")),
            scratch_bytes=parse_size("fabric_scratch_bytes", merged.get("fabric_scratch_bytes", 1 << 20)),
            dialect=parse_choice("fabric_dialect", merged.get("fabric_dialect", "large-object"), FABRIC_DIALECTS),
            bounce_bytes=parse_size("fabric_bounce_bytes", merged.get("fabric_bounce_bytes", 64 << 20)),
        )
    if any(n.path for n in values.get("nodes", ())) and values.get("cluster") == "yes":
        raise ConfigError("cluster", "'no' or 'auto' with a unix:// url", "yes")
    s = Settings(**values)
    if s.db != 0 and (s.cluster == "yes" or len(s.nodes) > 1):
        raise ConfigError("url", "database 0 with Valkey Cluster (clusters have one database)", s.db)
    if s.max_chunk_bytes > (512 << 20) - 4096:
        raise ConfigError("max_chunk_bytes", "at most 512MiB minus the header (Valkey's default proto-max-bulk-len)", s.max_chunk_bytes)
    if s.put_replicas and s.transport != "tcp":
        # fabric and blob-tcp puts complete in the module, on connections of their own: a WAIT
        # there is not yet sent, and a setting that silently did nothing would be worse
        raise ConfigError("put_replicas", "0, or transport: tcp (fabric and blob-tcp puts are not confirmed "
                                          "by WAIT yet)", f"{s.put_replicas} with transport {s.transport}")
    if s.lookup_timeout_s > s.op_timeout_s:
        raise ConfigError("lookup_timeout_s", f"at most op_timeout_s ({s.op_timeout_s})", s.lookup_timeout_s)
    return s


def tenant_secret_missing(s: Settings) -> bool:
    """True when a worker of these settings must not derive chunk ids: a tenant other than
    ``default``, no ``tenant_secret``, and no explicit ``require_tenant_secret: false``."""
    return s.tenant != "default" and s.tenant_secret is None and s.require_tenant_secret


def check_tenant_secret(s: Settings) -> None:
    """Called where a worker derives its namespace (``session.namespace_for``), at start-up:
    without the tenant's secret, anyone who learns one of its key names or its namespace
    digest can confirm that a guessed prompt was cached by that tenant (docs/security.md,
    "Tenant secrets"). tierd, doctor and quickbench never derive a tenant's ids: unaffected."""
    if tenant_secret_missing(s):
        raise ConfigError(
            "tenant_secret",
            f"a tenant secret for tenant {s.tenant!r} (a tenant other than 'default' needs one): set "
            "tenant_secret_file (or LMCACHE_VALKEY_TENANT_SECRET_FILE; 16-4096 bytes, e.g. `openssl rand -hex 32`, "
            "the same in every worker of the tenant), or accept that whoever learns a key name can confirm a "
            "guessed prompt was cached with require_tenant_secret: false (or "
            "LMCACHE_VALKEY_REQUIRE_TENANT_SECRET=0); docs/security.md")


def settings_from_url(url: str, **kw: Any) -> Settings:
    return settings_from_mapping({"url": url}, **kw)


__all__ = [
    "Node",
    "TLSSettings",
    "FabricSettings",
    "Settings",
    "KNOWN_KEYS",
    "parse_url",
    "parse_bool",
    "parse_choice",
    "parse_int",
    "parse_number",
    "parse_opt_seconds",
    "parse_opt_str",
    "parse_seconds",
    "parse_size",
    "parse_str",
    "settings_from_mapping",
    "settings_from_url",
    "check_tenant_secret",
    "tenant_secret_missing",
    "replace",
    "fields",
]
