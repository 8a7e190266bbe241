"""The CLI as a user meets it: one-line errors with the documented exit codes (and JSON with
--json), size strings, --version, and the server module built from the installed sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.servers import ValkeyServer

import lmcache_valkey

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lmcache_valkey", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert r.returncode == code, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_bad_checksum_setting_in_the_environment_is_one_line_not_a_traceback():
    """LMCACHE_VALKEY_CRC32C is read while the package imports, before the CLI can catch
    anything: the installed command and ``python -m lmcache_valkey`` still answer with one
    line naming it, exit code 2 (before: a traceback from the import)."""
    env = dict(os.environ, LMCACHE_VALKEY_CRC32C="fastest")
    script = Path(sys.executable).with_name("lmcache-valkey")
    for command in ([str(script)], [sys.executable, "-m", "lmcache_valkey"]):
        r = subprocess.run([*command, "doctor", "--json"], capture_output=True, text=True, timeout=120, env=env,
                           cwd=ROOT)
        one_line_error(r, 2, "LMCACHE_VALKEY_CRC32C", "auto, isal or crc32c", "'fastest'")
        assert json.loads(r.stdout) == {"ok": False, "error": r.stderr.strip().split(": ", 1)[1], "exit_code": 2}
    # and a good value reaches the CLI itself
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, LMCACHE_VALKEY_CRC32C="crc32c"), cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == f"lmcache-valkey {lmcache_valkey.__version__}"


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"lmcache-valkey {lmcache_valkey.__version__}"


@pytest.mark.parametrize("content, needle", [
    (None, "No such file or directory"),
    ("extra_config: [1, 2\n", "valid YAML"),
    ("- just\n- a list\n", "an LMCache YAML mapping"),
    ("chunk_size: 256\nextra_config:\n  remote_storage_plugin.other.url: valkey://x:1\n",
     "remote_storage_plugin.valkey.* keys"),
    ("extra_config:\n  remote_storage_plugin.valkey.url: http://nope:1\n", "remote_storage_plugin.valkey.url"),
    ("extra_config:\n  remote_storage_plugin.valkey.tiering: sometimes\n", "remote_storage_plugin.valkey.tiering"),
])
def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path, content, needle):
    path = tmp_path / "lmcache.yaml"
    if content is not None:
        path.write_text(content)
    for command in ("doctor", "bench"):
        one_line_error(cli(command, "--config", str(path)), 2, "--config" if content is None else "", needle)
    r = cli("doctor", "--config", str(path), "--json")
    assert r.returncode == 2
    answer = json.loads(r.stdout)
    assert answer["exit_code"] == 2 and needle in answer["error"]


def test_bench_takes_size_strings(valkey_server):
    r = cli("bench", "--url", valkey_server.url, "--transport", "tcp", "--chunk-bytes", "256KiB", "--chunks", "4",
            "--rounds", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["chunk_bytes"] == 256 << 10
    r = cli("bench", "--url", valkey_server.url, "--transport", "tcp", "--chunk-bytes", "1MiB", "--chunks", "2",
            "--rounds", "1")
    assert r.returncode == 0 and "2 x 1.0 MiB" in r.stdout, r.stdout + r.stderr
    one_line_error(cli("bench", "--url", valkey_server.url, "--chunk-bytes", "4XB"), 2, "--chunk-bytes", "512MiB")
    one_line_error(cli("bench", "--url", valkey_server.url, "--chunk-bytes", "1GiB"), 2, "max_chunk_bytes")


def test_unreachable_server_is_one_line_and_exit_1():
    from support.servers import free_port

    one_line_error(cli("bench", "--url", f"valkey://127.0.0.1:{free_port()}", "--transport", "tcp"), 1, "cannot")


# --- the server module for pip users ---------------------------------------------------------

def test_endpoint_build_makes_a_module_valkey_loads(tmp_path):
    r = cli("endpoint", "build", "--out", str(tmp_path / "mod"), timeout=300)
    assert r.returncode == 0, r.stderr
    so = Path(r.stdout.strip())
    assert so == tmp_path / "mod" / "lmcv_blob.so" and so.is_file()
    assert "--loadmodule" in r.stderr
    with ValkeyServer(args=["--loadmodule", str(so), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1"]) as s:
        modules = s.cmd("MODULE", "LIST")
    assert any(b"lmcvblob" in entry for entry in modules), modules


def test_endpoint_build_names_the_packages_it_is_missing(tmp_path):
    env = dict(os.environ, LMCACHE_VALKEY_LIBFABRIC_PREFIX=str(tmp_path / "nowhere"))
    one_line_error(cli("endpoint", "build", "--out", str(tmp_path), env=env), 1, "libfabric headers",
                   "apt-get install build-essential libfabric-dev")
    bare = tmp_path / "bin"  # a PATH with python but neither make nor cc
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    env = dict(os.environ, PATH=str(bare))
    env.pop("CC", None)
    one_line_error(cli("endpoint", "build", "--out", str(tmp_path), env=env), 1, "needs make and cc",
                   "build-essential")
    assert not (tmp_path / "lmcv_blob.so").exists()


def test_doctor_names_the_build_command_when_the_module_is_missing(valkey_server):
    r = cli("doctor", "--url", valkey_server.url, "--transport", "fabric", "--json")
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 1 and checks["modules"]["status"] == "fail"
    assert "lmcache-valkey endpoint build --out DIR" in checks["modules"]["fix"]
    assert "endpoint/build" not in checks["modules"]["fix"]  # a path only a checkout has


def test_the_fabric_transport_against_a_plain_valkey_names_the_build_command(valkey_server):
    import asyncio

    from lmcache_valkey.errors import FabricUnavailable
    from lmcache_valkey.transport.fabric import FabricTransport

    async def body() -> str:
        t = FabricTransport("127.0.0.1", valkey_server.port)
        try:
            t.register_buffer(bytearray(1 << 20))
            await t.connect()
        except FabricUnavailable as e:
            return str(e)
        finally:
            await t.close()
        return "connected"

    message = asyncio.run(body())
    assert "lmcache-valkey endpoint build --out DIR" in message and "endpoint/build" not in message, message
