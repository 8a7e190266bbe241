"""Imports run one way, and each third-party library stays in its one module (docs/layers.md)."""

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[2] / "lmcache_valkey"

# third-party top-level module -> the only places allowed to import it
FENCES = {
    "lmcache": ("integrations/lmcache/", "integrations/lmcache_mp/", "integrations/vllm_cpu/"),
    # Only the vLLM tier's version shim (every vLLM name and every release's difference);
    # its settings, lookup book and job runner stay importable without vLLM.
    "vllm": ("integrations/vllm/compat.py",
             # LMCache's CPU KV connector asks vLLM-CPU's attention kernel where KV bytes lie.
             "integrations/vllm_cpu/kv_connector.py"),
    # Only the SGLang backend's two edge modules; its settings and page math need no SGLang.
    "sglang": ("integrations/sglang/backend.py", "integrations/sglang/stats.py"),
    "torch": ("integrations/lmcache/", "integrations/lmcache_mp/", "integrations/sglang/", "integrations/vllm_cpu/",
              "demo.py", "serving/tiny_model.py"),
    "transformers": ("demo.py", "serving/tiny_model.py"),
    "tokenizers": ("serving/tiny_model.py",),
    "prometheus_client": ("metrics.py",),
    # cffi binds two C libraries, each in its own place: libfabric and ISA-L's CRC32C.
    "cffi": ("transport/fabric/", "checksum.py"),
    "aiobotocore": ("tiering/object_store.py",),
    "botocore": ("tiering/object_store.py",),
    "crc32c": ("checksum.py",),
}
# lmcache_valkey subpackage -> subpackages it must never import
FORBIDDEN = {
    "integrations/": ("transport",),  # integrations reach the servers only through the store
    "integrations/vllm/": ("integrations.lmcache", "integrations.sglang"),  # adapters share code below them, not with each other
    "integrations/lmcache/": ("integrations.vllm", "integrations.sglang"),
    "integrations/sglang/": ("integrations.lmcache", "integrations.lmcache_mp", "integrations.vllm"),
    "integrations/vllm_cpu/": ("integrations.lmcache", "integrations.sglang", "integrations.vllm.", "store", "session"),
    "store.py": ("integrations",),
    "session.py": ("integrations",),
    "transport/": ("integrations", "store", "tiering"),
    "tiering/": ("integrations", "store", "transport.fabric"),
    "codec.py": ("integrations", "store", "transport", "tiering"),
    "checksum.py": ("integrations", "store", "transport", "tiering", "codec", "config"),  # errors: a leaf, for its ConfigError
    "keys.py": ("integrations", "store", "transport", "tiering"),
    "config.py": ("integrations", "store", "transport", "tiering"),
    "settings.py": ("integrations", "store", "transport", "session"),
    "timeouts.py": ("integrations", "store", "transport", "tiering", "config", "errors"),
}


def imports_of(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    pkg_parts = path.relative_to(PKG.parent).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                yield ".".join(base + ((node.module,) if node.module else ()))
            elif node.module:
                yield node.module


def modules():
    for p in sorted(PKG.rglob("*.py")):
        yield p.relative_to(PKG).as_posix(), p


def test_third_party_libraries_are_fenced():
    bad = []
    for rel, p in modules():
        for name in imports_of(p):
            top = name.split(".")[0]
            if top in FENCES and not rel.startswith(FENCES[top]):
                bad.append(f"{rel} imports {name}")
    assert not bad, bad


def test_imports_run_one_way():
    bad = []
    for rel, p in modules():
        for prefix, banned in FORBIDDEN.items():
            if not rel.startswith(prefix):
                continue
            for name in imports_of(p):
                if not name.startswith("lmcache_valkey."):
                    continue
                inner = name[len("lmcache_valkey."):]
                if any(inner == b or inner.startswith(b + ".") for b in banned):
                    bad.append(f"{rel} imports {name}")
    assert not bad, bad
