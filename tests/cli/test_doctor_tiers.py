"""doctor explains a TLS/plain mismatch, and checks the tiering keys of --config as the worker
will use them: the embedded NVMe directory and bucket, or a tierd answering for the tenant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    p = subprocess.run([sys.executable, "-m", "lmcache_valkey", "doctor", "--json", *args],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    return p.returncode, {c["name"]: c for c in json.loads(p.stdout)}


def config(tmp_path: Path, url: str, **keys: object) -> str:
    path = tmp_path / "lmcache.yaml"
    lines = ["chunk_size: 256", "extra_config:", f"  remote_storage_plugin.valkey.url: {url}",
             "  remote_storage_plugin.valkey.transport: tcp"]
    lines += [f"  remote_storage_plugin.valkey.{k}: {v}" for k, v in keys.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_plain_client_on_a_tls_port_is_told_to_use_tls(valkey_tls_server):
    plain = valkey_tls_server.url.replace("valkeys://", "valkey://")
    code, checks = doctor("--url", plain, "--transport", "tcp")
    assert code == 1 and checks["tls"]["status"] == "fail", checks
    assert "speaks TLS" in checks["tls"]["detail"] and "valkeys://" in checks["tls"]["fix"]
    assert "is Valkey running" not in json.dumps(checks)


def test_a_tls_client_on_a_plain_port_is_told_the_port_is_plain(valkey_server):
    code, checks = doctor("--url", valkey_server.url.replace("valkey://", "valkeys://"), "--transport", "tcp")
    assert code == 1 and checks["tls"]["status"] == "fail", checks
    assert "plain RESP, not TLS" in checks["tls"]["detail"] and "valkey://" in checks["tls"]["fix"]


def test_nothing_listening_is_still_a_connect_failure():
    code, checks = doctor("--url", f"valkeys://127.0.0.1:{free_port()}", "--transport", "tcp")
    assert code == 1 and checks["connect"]["status"] == "fail" and "tls" not in checks


def test_embedded_tiering_checks_the_nvme_directory(valkey_server, tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    code, checks = doctor("--config", config(tmp_path, valkey_server.url, tiering="embedded", nvme_dir=nvme,
                                             nvme_budget_bytes="1MiB"))
    assert checks["tiering"]["status"] == "ok" and "embedded" in checks["tiering"]["detail"]
    assert checks["nvme"]["status"] == "ok", checks["nvme"]
    assert "budget 1.0 MiB" in checks["nvme"]["detail"]

    _, checks = doctor("--config", config(tmp_path, valkey_server.url, tiering="embedded", nvme_dir=nvme,
                                          nvme_budget_bytes="1000TiB"))
    assert checks["nvme"]["status"] == "fail" and "exceeds the filesystem" in checks["nvme"]["detail"]

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, checks = doctor("--config", config(tmp_path, valkey_server.url, tiering="embedded",
                                             nvme_dir=locked / "tier"))
    if os.geteuid() != 0:  # root writes anywhere
        assert code == 1 and checks["nvme"]["status"] == "fail" and "cannot be created" in checks["nvme"]["detail"]


def test_embedded_tiering_checks_the_configured_bucket(valkey_server, tmp_path, monkeypatch):
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                     aws_access_key_id="x", aws_secret_access_key="x").create_bucket(Bucket="kv-cold")
        cfg = config(tmp_path, valkey_server.url, tiering="embedded", s3_bucket="kv-cold",
                     s3_endpoint_url=f"http://127.0.0.1:{port}")
        code, checks = doctor("--config", cfg)
        assert checks["s3"]["status"] == "ok" and "kv-cold" in checks["s3"]["detail"], checks
        cfg = config(tmp_path, valkey_server.url, tiering="embedded", s3_bucket="kv-missing",
                     s3_endpoint_url=f"http://127.0.0.1:{port}")
        code, checks = doctor("--config", cfg)
        assert code == 1 and checks["s3"]["status"] == "fail"
    finally:
        moto.stop()


def test_s3_check_without_the_s3_extra_names_the_extra(valkey_server, tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['aiobotocore'] = None\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]))
    code, checks = doctor("--url", valkey_server.url, "--transport", "tcp", "--s3-bucket", "kv-cold", env=env)
    assert code == 1 and checks["s3"]["status"] == "fail"
    assert checks["s3"]["fix"] == "pip install 'lmcache-valkey[s3]'" and "unexpected" not in checks["s3"]["detail"]


def test_service_tiering_needs_a_tierd_for_the_tenant(valkey_server, tmp_path):
    cfg = config(tmp_path, valkey_server.url, tiering="service", tenant="t1")
    code, checks = doctor("--config", cfg)
    assert code == 1 and checks["tiering"]["status"] == "fail", checks
    assert "no tierd answered for tenant 't1'" in checks["tiering"]["detail"]
    assert "lmcache-valkey tierd" in checks["tiering"]["fix"]

    nvme = tmp_path / "nvme"
    tierd = subprocess.Popen([sys.executable, "-m", "lmcache_valkey", "tierd", "--valkey-url", valkey_server.url,
                              "--tenant", "t1", "--nvme-dir", str(nvme), "--set", "request_block_s=0.2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            code, checks = doctor("--config", cfg)
            if checks["tiering"]["status"] == "ok":
                break
            assert time.monotonic() < deadline, checks["tiering"]
        assert "tierd answers for tenant 't1' (tiers: nvme" in checks["tiering"]["detail"]
        assert "nvme" not in checks  # tierd's directory lives on the storage node, not here
    finally:
        tierd.terminate()
        tierd.wait(30)


def test_tiering_off_is_reported_as_such(valkey_server):
    _, checks = doctor("--url", valkey_server.url, "--transport", "tcp")
    assert checks["tiering"]["status"] == "skip" and "off" in checks["tiering"]["detail"]
