"""`lmcache-valkey doctor` names each failure it claims to detect, when that failure is staged."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys


from support.servers import ValkeyServer, free_port, make_tls_files

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE_SO = ROOT / "endpoint" / "build" / "lmcv_blob.so"


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    p = subprocess.run([sys.executable, "-m", "lmcache_valkey", "doctor", "--json", *args],
                       capture_output=True, text=True, timeout=120,
                       env=None if env is None else {**os.environ, **env})
    if p.returncode == 2:
        return 2, {"usage": {"status": "fail", "detail": p.stderr}}
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    return p.returncode, checks


def test_healthy_server_passes(valkey_server):
    valkey_server.cmd("CONFIG", "SET", "maxmemory", "64mb")
    valkey_server.cmd("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    code, checks = doctor("--url", valkey_server.url, "--transport", "tcp")
    assert code == 0, checks
    assert checks["connect"]["status"] == "ok"
    assert "Valkey 9.1" in checks["server"]["detail"]
    assert checks["memory"]["status"] == "ok" and checks["acl"]["status"] == "ok"
    assert checks["checksum"]["status"] == "ok" and "ISA-L" in checks["checksum"]["detail"]


def test_names_the_checksum_library_a_process_was_told_to_use(valkey_server):
    code, checks = doctor("--url", valkey_server.url, "--transport", "tcp", env={"LMCACHE_VALKEY_CRC32C": "crc32c"})
    assert code == 0 and checks["checksum"]["status"] == "ok"
    assert "crc32c package" in checks["checksum"]["detail"]


def test_unbounded_memory_is_a_warning_not_a_failure(valkey_server):
    code, checks = doctor("--url", valkey_server.url, "--transport", "tcp")
    assert code == 0 and checks["memory"]["status"] == "warn" and "maxmemory" in checks["memory"]["fix"]


def test_wrong_password_is_named(valkey_server, tmp_path):
    valkey_server.cmd("CONFIG", "SET", "requirepass", "right")
    pw = tmp_path / "pw"
    pw.write_text("wrong")
    code, checks = doctor("--url", valkey_server.url, "--password-file", str(pw), "--transport", "tcp")
    assert code == 1
    assert checks["auth"]["status"] == "fail" and "password" in checks["auth"]["fix"]


def test_acl_user_outside_its_tenant_is_named(valkey_server, tmp_path):
    valkey_server.cmd("ACL", "SETUSER", "carol", "on", ">pw", "resetkeys", "~lmcv:other:*", "+@all")
    pw = tmp_path / "pw"
    pw.write_text("pw")
    code, checks = doctor("--url", valkey_server.url, "--username", "carol", "--password-file", str(pw),
                          "--tenant", "mine", "--transport", "tcp")
    assert code == 1 and checks["acl"]["status"] == "fail" and "~lmcv:mine:*" in checks["acl"]["fix"]


def test_unreachable_server_is_named():
    code, checks = doctor("--url", f"valkey://127.0.0.1:{free_port()}", "--transport", "tcp")
    assert code == 1 and checks["connect"]["status"] == "fail"
    assert checks["server"]["status"] == "skip"


def test_untrusted_tls_certificate_is_named(valkey_tls_server, tmp_path):
    other = make_tls_files(tmp_path / "other")
    code, checks = doctor("--url", valkey_tls_server.url, "--tls-ca-file", other.ca_file, "--transport", "tcp")
    assert code == 1 and checks["tls"]["status"] == "fail", checks
    ok_code, ok = doctor("--url", valkey_tls_server.url, "--tls-ca-file", valkey_tls_server.tls.ca_file,
                         "--transport", "tcp")
    assert ok["tls"]["status"] == "ok" and ok["connect"]["status"] == "ok"


def test_missing_fabric_module_is_named(valkey_server):
    code, checks = doctor("--url", valkey_server.url, "--transport", "fabric")
    assert code == 1 and checks["modules"]["status"] == "fail" and "lmcv_blob.so" in checks["modules"]["fix"]


def test_loaded_fabric_module_and_provider_pass():
    assert MODULE_SO.exists(), "endpoint module not built (scripts/setup.sh runs make -C endpoint)"
    with ValkeyServer(args=["--loadmodule", str(MODULE_SO), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1"]) as s:
        code, checks = doctor("--url", s.url, "--transport", "fabric")
    assert checks["modules"]["status"] == "ok", checks
    assert checks["fabric"]["status"] == "ok", checks


def _module_server(*extra: str) -> ValkeyServer:
    assert MODULE_SO.exists(), "endpoint module not built (scripts/setup.sh runs make -C endpoint)"
    return ValkeyServer(args=["--loadmodule", str(MODULE_SO), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1", *extra])


def test_the_chosen_transport_dialect_and_provider_are_reported():
    with _module_server("require_proof", "yes") as s:
        code, checks = doctor("--url", s.url, "--transport", "auto")
    t = checks["transport"]
    assert code == 0 and t["status"] == "ok", checks
    assert "BLOB.RDMA" in t["detail"] and "tcp;ofi_rxm" in t["detail"] and "proved" in t["detail"]


def test_a_large_object_server_without_our_extensions_is_a_stated_risk():
    with _module_server("extensions", "no", "require_proof", "no") as s:
        code, checks = doctor("--url", s.url, "--transport", "fabric")
    t = checks["transport"]
    assert t["status"] == "warn" and "remote keys" in t["detail"] and "require_proof" in t["fix"], t


def test_the_fabric_peer_mode_is_reported_and_the_weak_one_warned(tmp_path):
    """The module's default (an address proof required) passes; `require_proof no` is a
    warning that says what it leaves open -- seen by an operator (INFO) and by a user on the
    worker line (no INFO: the doctor asks HELLO instead)."""
    from support.acl_lines import setuser

    from lmcache_valkey import acl

    pw = tmp_path / "pw"
    pw.write_text("pw")
    for extra, status in (((), "ok"), (("require_proof", "no"), "warn")):
        with _module_server(*extra) as s:
            setuser(s, acl.worker_line("w", "team-a", fabric=True, password="pw"), "pw", name="w")
            _, admin = doctor("--url", s.url, "--transport", "tcp")
            _, worker = doctor("--url", s.url, "--transport", "tcp", "--username", "w", "--password-file", str(pw),
                               "--tenant", "team-a")
        for checks in (admin, worker):
            peers = checks["fabric_peers"]
            assert peers["status"] == status, (extra, checks)
            if status == "warn":
                assert "fabric address" in peers["detail"] and "require_proof no" in peers["fix"], peers
            else:
                assert "require_proof yes" in peers["detail"], peers
        # the worker line has no INFO: its answer came from the HELLO probe
        assert "BLOB.RDMA_HELLO" in worker["fabric_peers"]["detail"]
        assert "BLOB.RDMA_HELLO" not in admin["fabric_peers"]["detail"]


def test_under_auto_the_worker_line_names_the_large_object_commands_where_the_module_answers(valkey_server, tmp_path):
    """`auto` takes the fabric path wherever the module answers, so the worker line the doctor
    prints must allow it there (and must not name BLOB.* where no module is loaded: ACL
    SETUSER would refuse the whole line)."""
    from lmcache_valkey import acl
    from support.acl_lines import setuser

    pw = tmp_path / "pw"
    pw.write_text("pw")
    wide = ("ACL", "SETUSER", "wide", "on", ">pw", "resetkeys", "~lmcv:team-a:*", "-@all", "+@read", "+@write",
            "+@connection", "+flushall", "+command")
    with _module_server() as s:
        s.cmd(*wide)
        code, checks = doctor("--url", s.url, "--transport", "auto", "--username", "wide", "--password-file",
                              str(pw), "--tenant", "team-a")
        fix = checks["scope"]["fix"]
        assert checks["scope"]["status"] == "warn" and acl.worker_line("wide", "team-a", tiering=True, fabric=True) in fix
        line = fix.split(": ", 1)[1].split(" (tierd", 1)[0]
        setuser(s, line, "pw", name="copied")  # the printed line is one the server takes
    valkey_server.cmd(*wide)
    code, checks = doctor("--url", valkey_server.url, "--transport", "auto", "--username", "wide", "--password-file",
                          str(pw), "--tenant", "team-a")
    assert acl.worker_line("wide", "team-a", tiering=True) in checks["scope"]["fix"]
    assert "blob." not in checks["scope"]["fix"]


def test_blob_tcp_is_checked_with_a_documented_command(valkey_server):
    with _module_server() as s:
        code, checks = doctor("--url", s.url, "--transport", "blob-tcp")
    assert checks["transport"]["status"] == "ok" and "BLOB.TCP_SET" in checks["transport"]["detail"], checks
    assert checks["fabric"]["status"] == "skip"
    code, checks = doctor("--url", valkey_server.url, "--transport", "blob-tcp")
    assert code == 1 and checks["transport"]["status"] == "fail" and "BLOB.INFO" in checks["transport"]["detail"]


def test_auto_says_why_it_fell_back_to_strings(valkey_server):
    code, checks = doctor("--url", valkey_server.url, "--transport", "auto")
    assert checks["transport"]["status"] == "ok" and "auto chose tcp" in checks["transport"]["detail"], checks


def test_s3_down_is_named_and_s3_up_passes(valkey_server):
    from moto.server import ThreadedMotoServer

    port = free_port()
    code, checks = doctor("--url", valkey_server.url, "--transport", "tcp", "--s3-bucket", "kv-cache",
                          "--s3-endpoint-url", f"http://127.0.0.1:{port}")
    assert code == 1 and checks["s3"]["status"] == "fail"
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    moto.start()
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                     aws_access_key_id="x", aws_secret_access_key="x").create_bucket(Bucket="kv-cache")
        code, checks = doctor("--url", valkey_server.url, "--transport", "tcp", "--s3-bucket", "kv-cache",
                              "--s3-endpoint-url", f"http://127.0.0.1:{port}")
        assert checks["s3"]["status"] == "ok", checks
    finally:
        moto.stop()


def test_malformed_settings_exit_2():
    code, checks = doctor("--url", "http://nope:1")
    assert code == 2 and "url" in checks["usage"]["detail"]


# team-a's key secret, as its workers get it (a tenant other than "default" needs one).
TEAM_A_SECRET = {"LMCACHE_VALKEY_TENANT_SECRET": "team-a-secret-0123456789"}


def _as_user(server, tmp_path, user: str, *extra: str, env: dict[str, str] | None = TEAM_A_SECRET):
    pw = tmp_path / f"{user}-pw"
    pw.write_text("pw")
    return doctor("--url", server.url, "--username", user, "--password-file", str(pw), "--tenant", "team-a",
                  "--transport", "tcp", *extra, env=env)


def test_a_user_that_reaches_past_its_tenant_is_warned_and_nothing_is_run(valkey_server, tmp_path):
    from lmcache_valkey import acl
    from support.acl_lines import setuser

    old = ["-@all", "+@read", "+@write", "+@connection", "+info"]  # the line this project used to print
    valkey_server.cmd("ACL", "SETUSER", "old", "on", ">pw", "resetkeys", "~lmcv:team-a:*", *old)
    valkey_server.cmd("ACL", "SETUSER", "txn", "on", ">pw", "resetkeys", "~lmcv:team-a:*", "-@all", "+get", "+set",
                      "+unlink", "+multi", "+discard", "+keys", "+monitor")
    valkey_server.cmd("ACL", "SETUSER", "admin", "on", ">pw", "~*", "&*", "+@all")
    setuser(valkey_server, acl.worker_line("team-a", "team-a", tiering=True), "pw")
    valkey_server.cmd("SET", "lmcv:team-b:canary", "theirs")
    code, checks = _as_user(valkey_server, tmp_path, "old")  # direct probes with harmless arguments
    assert code == 0 and checks["scope"]["status"] == "warn", checks["scope"]
    for verb in ("FLUSHALL", "FLUSHDB", "SWAPDB", "RESTORE", "SCAN", "RANDOMKEY", "CLIENT KILL", "CLIENT PAUSE"):
        assert verb in checks["scope"]["detail"], verb
    assert acl.worker_line("old", "team-a", tiering=True) in checks["scope"]["fix"]
    _, checks = _as_user(valkey_server, tmp_path, "txn")  # queued in MULTI, discarded
    assert checks["scope"]["status"] == "warn" and "KEYS" in checks["scope"]["detail"]
    assert "MONITOR" in checks["scope"]["detail"] and "FLUSHALL" not in checks["scope"]["detail"]
    _, checks = _as_user(valkey_server, tmp_path, "admin")  # asked with ACL DRYRUN
    assert checks["scope"]["status"] == "warn" and "ACL" in checks["scope"]["detail"]
    assert "SHUTDOWN" in checks["scope"]["detail"] and "KEYS" in checks["scope"]["detail"]
    code, checks = _as_user(valkey_server, tmp_path, "team-a")  # the recommended line
    assert code == 0 and checks["scope"]["status"] == "ok", checks["scope"]
    assert checks["acl"]["status"] == "ok" and checks["server"]["status"] == "skip"
    # nothing the probes named was run
    assert valkey_server.cmd("GET", "lmcv:team-b:canary") == b"theirs"
    assert valkey_server.cmd("DBSIZE") == 1


def test_a_tenant_without_a_key_secret_fails_and_its_explicit_opt_out_is_warned(valkey_server, tmp_path):
    valkey_server.cmd("ACL", "SETUSER", "team-a", "on", ">pw", "~lmcv:team-a:*", "+@all")
    code, checks = _as_user(valkey_server, tmp_path, "team-a", env=None)  # its workers would not start
    assert code == 1 and checks["secret"]["status"] == "fail", checks["secret"]
    assert "tenant_secret_file" in checks["secret"]["fix"] and "require_tenant_secret: false" in checks["secret"]["fix"]
    _, checks = _as_user(valkey_server, tmp_path, "team-a", env={"LMCACHE_VALKEY_REQUIRE_TENANT_SECRET": "0"})
    assert checks["secret"]["status"] == "warn" and "require_tenant_secret: false" in checks["secret"]["detail"]
    assert "tenant_secret" in checks["secret"]["fix"]
    secret = tmp_path / "secret"
    secret.write_text("team-a-secret-0123456789")
    cfg = tmp_path / "lmcache.yaml"
    cfg.write_text("extra_config:\n"
                   f"  remote_storage_plugin.valkey.tenant_secret_file: {secret}\n"
                   "  remote_storage_plugin.valkey.tenant: team-a\n")
    _, checks = _as_user(valkey_server, tmp_path, "team-a", "--config", str(cfg))
    assert checks["secret"]["status"] == "ok"


def test_a_dma_dialect_worker_is_checked_in_its_own_dialect(tmp_path):
    """fabric_dialect: dma -- the doctor asks DMA.HELLO, names the module that answers, and
    reports the peer mode and the transport in Momento's terms."""
    cfg = tmp_path / "lmcache.yaml"
    with _module_server() as s:
        cfg.write_text("chunk_size: 256\nextra_config:\n"
                       f"  remote_storage_plugin.valkey.url: {s.url}\n"
                       "  remote_storage_plugin.valkey.transport: fabric\n"
                       "  remote_storage_plugin.valkey.fabric_dialect: dma\n"
                       "  remote_storage_plugin.valkey.fabric_provider: tcp;ofi_rxm\n"
                       "  remote_storage_plugin.valkey.fabric_bind_addr: 127.0.0.1\n")
        code, checks = doctor("--config", str(cfg))
    assert checks["modules"]["status"] == "ok" and "DMA.HELLO" in checks["modules"]["detail"], checks
    assert "reference module" in checks["modules"]["detail"]
    assert checks["fabric_peers"]["status"] == "ok", checks
    t = checks["transport"]
    assert t["status"] == "ok" and "Momento's DMA dialect" in t["detail"] and "proved" in t["detail"], t


def test_says_which_resharding_a_cluster_with_the_module_offers():
    """Valkey 9 moves the module's keys by CLUSTER MIGRATESLOTS; a Valkey 8 cluster only by
    the legacy kind, which the user is told (the command does not exist there)."""
    import shutil

    from support.servers import DEBIAN_VALKEY, ValkeyCluster

    assert MODULE_SO.exists(), "endpoint module not built (scripts/setup.sh runs make -C endpoint)"
    module = ["--loadmodule", str(MODULE_SO), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1"]
    with ValkeyCluster(3, args=module) as c:
        code, checks = doctor("--url", c.url, "--transport", "fabric")
        assert checks["slot_migration"]["status"] == "ok", checks
        assert "MIGRATESLOTS" in checks["slot_migration"]["detail"]
    if not shutil.which(DEBIAN_VALKEY):
        return
    with ValkeyCluster(3, binary=DEBIAN_VALKEY, args=module) as c:
        code, checks = doctor("--url", c.url, "--transport", "fabric")
        assert checks["slot_migration"]["status"] == "warn", checks
        assert "legacy" in checks["slot_migration"]["detail"] and "reshard" in checks["slot_migration"]["fix"]
