"""The chart refuses values that cannot work together, renders the README's install command,
mounts what operators add, and monitors itself: a PrometheusRule checked by `promtool test
rules`, and a Valkey exporter sidecar whose rendered command is run (Debian's
prometheus-redis-exporter, the same release as the image) against a real Valkey."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from lmcache_valkey import acl

pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) is not installed")

from support.helmrender import CHART, NAMESPACE, ROOT, manifests, of_kind, render, render_error  # noqa: E402
from support.procs import sigterm_and_collect  # noqa: E402
from support.servers import DEBIAN_VALKEY, ValkeyServer, free_port, make_tls_files  # noqa: E402

EXPORTER = shutil.which("prometheus-redis-exporter") or "/usr/bin/prometheus-redis-exporter"
FULL = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())


def _pod(values: dict) -> dict:
    (sts,) = of_kind(manifests(values), "StatefulSet")
    return sts["spec"]["template"]["spec"]


def _container(values: dict, name: str) -> dict:
    (c,) = [c for c in _pod(values)["containers"] if c["name"] == name]
    return c


# --- values that cannot work together fail the render, saying what to change ----------------
def test_maxmemory_above_the_memory_limit_fails_with_the_fix():
    message = render_error({"valkey": {"maxmemory": "48gb"}})
    assert "valkey.maxmemory 48gb (48.0 GiB)" in message
    assert "valkey.resources.limits.memory 8Gi (8.0 GiB)" in message
    assert "about 60Gi" in message  # maxmemory + 25 %
    manifests({"valkey": {"maxmemory": "48gb", "resources": {"limits": {"memory": "60Gi"}}}})  # the fix renders


def test_the_modules_arena_counts_against_the_memory_limit():
    message = render_error({"valkey": {"maxmemory": "6gb", "module": {"enabled": True, "args": ["arena_mb", 4096]}}})
    assert "plus the module's arena (4.0 GiB)" in message
    manifests({"valkey": {"maxmemory": "6gb", "module": {"enabled": True, "args": ["arena_mb", 2048]}}})


def test_valkey_size_units_follow_valkey():
    # 8g is 8e9 bytes (7.45 GiB) and fits 8Gi; 8gb is 8 GiB: with the default 1 GiB arena it does not.
    manifests({"valkey": {"maxmemory": "7g", "module": {"enabled": True}}})
    render_error({"valkey": {"maxmemory": "8gb", "module": {"enabled": True}}})


def test_nvme_budget_above_the_volume_fails_with_the_fix():
    message = render_error({"tierd": {"nvme": {"budgetBytes": 3000000000000}}})
    assert "tierd.nvme.budgetBytes 3000000000000 (2.7 TiB) exceeds tierd.nvme.volume.size 110Gi" in message
    assert "at least 3074Gi" in message
    render_error({"tierd": {"nvme": {"budgetBytes": 2 << 30, "volume": {"type": "emptyDir", "size": "1Gi"}}}})
    # hostPath has no size the chart knows: nothing to compare
    manifests({"tierd": {"nvme": {"budgetBytes": 3000000000000, "volume": {"type": "hostPath"}}}})


def test_the_readme_install_command_renders():
    readme = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```sh\n(helm install .*?)```", readme, re.S)
    words = shlex.split(block.replace("\\\n", " "))
    values: dict = {}
    for i, word in enumerate(words):
        if word == "--set":
            key, _, raw = words[i + 1].partition("=")
            node = values
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = yaml.safe_load(raw) if raw.isdigit() else raw
    (sts,) = of_kind(manifests(values), "StatefulSet")
    claims = {c["metadata"]["name"]: c for c in sts["spec"]["volumeClaimTemplates"]}
    assert claims["nvme"]["spec"]["storageClassName"] == "local-nvme"


def test_an_existing_claim_backs_the_nvme_tier_of_one_pod():
    values = {"tierd": {"nvme": {"volume": {"type": "existingClaim", "existingClaim": "kv-nvme"}}}}
    (sts,) = of_kind(manifests(values), "StatefulSet")
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["nvme"]["persistentVolumeClaim"] == {"claimName": "kv-nvme"}
    assert "volumeClaimTemplates" not in sts["spec"]
    message = render_error({**values, "valkey": {"mode": "cluster"}})
    assert "existingClaim serves one pod" in message and "volumeClaimTemplate" in message


# --- what operators add -----------------------------------------------------------------------
def test_extra_volumes_mounts_containers_and_startup_probes():
    pod = _pod(FULL)
    volumes = {v["name"] for v in pod["volumes"]}
    assert "audit" in volumes
    containers = {c["name"]: c for c in pod["containers"]}
    assert list(containers) == ["valkey", "tierd", "exporter", "log-shipper"]
    for name in ("valkey", "tierd"):
        assert "/var/log/audit" in [m["mountPath"] for m in containers[name]["volumeMounts"]], name
    assert containers["valkey"]["startupProbe"]["failureThreshold"] == 30
    assert containers["valkey"]["startupProbe"]["exec"]["command"][-1] == "live"
    tierd = containers["tierd"]["startupProbe"]
    assert tierd["httpGet"] == {"path": "/healthz", "port": "metrics"} and tierd["failureThreshold"] == 120
    defaults = {c["name"]: c for c in _pod({})["containers"]}
    # tierd rebuilds its index before /healthz answers: liveness waits up to 15 minutes
    probe = defaults["tierd"]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 900


# --- ServiceMonitor -----------------------------------------------------------------------------
def test_service_monitor_scrapes_the_exporter_without_tierd():
    values = yaml.safe_load((CHART / "ci" / "exporter-only-values.yaml").read_text())
    docs = manifests(values)
    (sm,) = of_kind(docs, "ServiceMonitor")
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["exporter"]
    assert sm["metadata"]["namespace"] == NAMESPACE
    (svc,) = [s for s in of_kind(docs, "Service") if s["metadata"]["labels"].get("lmcache-valkey/service") == "client"]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["valkey", "exporter"]
    (rule,) = of_kind(docs, "PrometheusRule")
    alerts = {r["alert"] for r in rule["spec"]["groups"][0]["rules"]}
    assert "LmcacheValkeyTierdDown" not in alerts and "LmcacheValkeyValkeyDown" in alerts
    message = render_error({"tierd": {"enabled": False}, "metrics": {"serviceMonitor": {"enabled": True}}})
    assert "needs something to scrape" in message


# --- PrometheusRule: promtool --------------------------------------------------------------------
def _rule(values: dict) -> dict:
    (rule,) = of_kind(manifests(values), "PrometheusRule")
    return rule


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run scripts/setup.sh (Debian package 'prometheus')")
    return path


RULE_VALUES = {"metrics": {"exporter": {"enabled": True}, "prometheusRule": {"enabled": True}}}


def test_alert_rules_pass_promtool_unit_tests(tmp_path):
    rule = _rule(RULE_VALUES)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run([_promtool(), "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    descriptions = {r["alert"]: r["annotations"]["description"] for r in rule["spec"]["groups"][0]["rules"]}
    assert not [a for a, d in descriptions.items() if "{{" in d], "descriptions are static text; labels go in summaries"
    spec = yaml.safe_load((Path(__file__).parent / "alerts_test.yaml").read_text())
    tested = set()
    for case in spec["tests"]:
        for t in case["alert_rule_test"]:
            tested.add(t["alertname"])
            for alert in t["exp_alerts"]:  # summary from the test file, description as rendered
                alert["exp_annotations"] = {"summary": alert.pop("summary"),
                                            "description": descriptions[t["alertname"]]}
    assert tested == set(descriptions), "every alert needs a promtool test case"
    spec["rule_files"] = ["rules.yaml"]
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run([_promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_take_the_values_thresholds_selector_and_namespace():
    values = {"metrics": {"prometheusRule": {"enabled": True, "errorRatio": 0.2, "selector": 'cluster="eu1"',
                                             "namespace": "monitoring", "labels": {"release": "prom"}}}}
    rule = _rule(values)
    assert rule["metadata"]["namespace"] == "monitoring" and rule["metadata"]["labels"]["release"] == "prom"
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert "> 0.2" in rules["LmcacheValkeyErrorRatioHigh"]["expr"]
    for r in rules.values():
        for selector in re.findall(r"\b(?:lmcache_valkey_\w+|up|redis_\w+)\{([^}]*)\}", r["expr"]):
            assert 'cluster="eu1"' in selector, (r["alert"], r["expr"])
    full = {r["alert"] for r in _rule(FULL)["spec"]["groups"][0]["rules"]}
    assert "LmcacheValkeyTeamAPaging" in full  # additionalRules


def test_alert_rules_watch_only_series_that_exist():
    from lmcache_valkey import metrics

    exported = set()
    for obj in vars(metrics).values():
        for family in getattr(obj, "describe", lambda: [])() if not isinstance(obj, type) else []:
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
            exported.update(family.name + s for s in suffixes)
    for r in _rule(RULE_VALUES)["spec"]["groups"][0]["rules"]:
        for name in re.findall(r"\blmcache_valkey_\w+", r["expr"]):
            assert name in exported, (r["alert"], name)


# --- the Valkey exporter sidecar, run as rendered against a real Valkey --------------------------
def _run_exporter(container: dict, valkey_port: int, env: dict[str, str], files: dict[str, str]):
    """The rendered container's command with the pod's addresses and paths mapped to this host."""
    port = free_port()
    args = []
    for arg in container["args"]:
        arg = re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{valkey_port}", arg)
        arg = re.sub(r"^-web\.listen-address=:\d+$", f"-web.listen-address=127.0.0.1:{port}", arg)
        for pod_path, local in files.items():
            arg = arg.replace(pod_path, local)
        args.append(arg)
    proc = subprocess.Popen([EXPORTER, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, port


def _scrape(proc, port: int, path: str = "/metrics") -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.read().decode()
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, sigterm_and_collect(proc)
            time.sleep(0.2)


def _dashboard_redis_names() -> set[str]:
    dash = json.loads((CHART / "dashboards" / "lmcache-valkey.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [r["expr"] for r in _rule(RULE_VALUES)["spec"]["groups"][0]["rules"]]
    return {n for e in exprs for n in re.findall(r"\bredis_\w+", e)}


def test_the_dashboard_shows_valkeys_memory_evictions_and_clients():
    dash = json.loads((CHART / "dashboards" / "lmcache-valkey.json").read_text())
    shown = {n for p in dash["panels"] for t in p.get("targets", []) for n in re.findall(r"\bredis_\w+", t["expr"])}
    assert {"redis_memory_used_bytes", "redis_memory_max_bytes", "redis_evicted_keys_total",
            "redis_connected_clients"} <= shown  # each checked against a real scrape below


EXPORTER_VALUES = {"auth": {"enabled": True, "existingSecret": "lmcv-acl"}, "tierd": {"tenant": "team-a"},
                   "client": {"tenant": "team-a"}, "metrics": {"exporter": {"enabled": True}}}
# The Secret's passwords, by placeholder in the notes' ACL lines and by Secret key.
PASSWORDS = {"OPS_PASSWORD": "ops-pw", "TIERD_PASSWORD": "tierd-pw", "MONITOR_PASSWORD": "monitor-pw", "PASSWORD": "team-a-pw"}
SECRET_KEYS = {"ops-password": "ops-pw", "tierd-password": "tierd-pw", "monitor-password": "monitor-pw"}


def _valkey_with_the_notes_acl(valkey: ValkeyServer, values: dict) -> None:
    """Every ACL line the install notes print, as an operator following them would add them."""
    from support.acl_lines import acl_lines, setuser

    notes = render(values)["lmcache-valkey/templates/NOTES.txt"]
    for line in acl_lines(notes).values():
        setuser(valkey, line, PASSWORDS[re.search(r">(\w+)", line).group(1)])
    valkey.cmd("ACL", "SETUSER", "default", "off")


def _exporter_env(container: dict) -> dict[str, str]:
    env = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        env[e["name"]] = SECRET_KEYS[ref["key"]] if ref else e["value"]
    return env


def test_exporter_sidecar_scrapes_valkey_as_its_monitoring_user():
    container = _container(EXPORTER_VALUES, "exporter")
    (secret,) = [e for e in container["env"] if e["name"] == "REDIS_PASSWORD"]
    assert secret["valueFrom"]["secretKeyRef"] == {"name": "lmcv-acl", "key": "monitor-password"}
    assert "-redis.user=lmcv-monitor" in container["args"]
    with ValkeyServer(args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]) as valkey:
        _valkey_with_the_notes_acl(valkey, EXPORTER_VALUES)
        valkey.cmd("CONFIG", "RESETSTAT", auth=("lmcv-ops", "ops-pw"))
        proc, port = _run_exporter(container, valkey.port, _exporter_env(container), {})
        try:
            assert _scrape(proc, port, "/health").strip() == "ok"  # the rendered livenessProbe path
            text = _scrape(proc, port)
            stats = valkey.cmd("INFO", "commandstats", auth=("lmcv-ops", "ops-pw")).decode()
        finally:
            log = sigterm_and_collect(proc)
    samples = {line.split("{")[0].split(" ")[0]: line for line in text.splitlines() if line and line[0] != "#"}
    assert samples["redis_up"].endswith(" 1"), text[:2000]
    assert float(samples["redis_memory_max_bytes"].split()[-1]) == 64 * 1024 * 1024
    for name in _dashboard_redis_names():  # every Valkey series the dashboard and alerts use
        assert name in samples, name
    # Its line allows exactly what it sends, except CONFIG GET, refused on purpose.
    # (AUTH is every user's; CONFIG RESETSTAT and the INFO reading these are this test's.)
    tried = {m.group(1) for m in re.finditer(r"^cmdstat_(\S+?):calls=(\d+),.*?rejected_calls=(\d+)", stats, re.M)
             if int(m.group(2)) or int(m.group(3))}
    assert tried - {"auth", "config|resetstat"} == set(acl.MONITOR) | set(acl.MONITOR_REFUSED), (tried, log[-2000:])
    assert re.search(r"^cmdstat_config\|get:calls=0,.*rejected_calls=[1-9]", stats, re.M), stats


def test_exporter_scrape_endpoint_hands_out_no_usable_credential_and_no_key_names():
    """redis_exporter 1.45 logs in at any address named by ``/scrape?target=`` and turns key
    listing on for ``/scrape?check-keys=``, for anyone who reaches its port: what it hands
    out that way can read no key, no configuration (``masterauth`` is the operators'
    password) and change nothing."""
    import socket
    import threading

    container = _container(EXPORTER_VALUES, "exporter")
    assert {"name": "REDIS_EXPORTER_DISABLE_SCRAPE_ENDPOINT", "value": "true"} in container["env"]
    heard: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)

    def fake_valkey() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            heard.append(conn.recv(4096))
            conn.sendall(b"-ERR no\r\n")

    catcher = threading.Thread(target=fake_valkey, daemon=True)
    catcher.start()
    own, other = "lmcv:team-a:ns:c:{01}", "lmcv:team-b:ns:c:{01}"
    with ValkeyServer() as valkey:
        _valkey_with_the_notes_acl(valkey, EXPORTER_VALUES)
        ops = ("lmcv-ops", "ops-pw")
        valkey.cmd("SET", own, "mine", auth=ops)
        valkey.cmd("SET", other, "theirs", auth=ops)
        valkey.cmd("CONFIG", "SET", "masterauth", "ops-pw", auth=ops)  # as start.sh writes it
        proc, port = _run_exporter(container, valkey.port, _exporter_env(container), {})
        try:
            _scrape(proc, port, "/health")
            fake = listener.getsockname()[1]
            _scrape(proc, port, f"/scrape?target=redis://127.0.0.1:{fake}")
            listed = _scrape(proc, port, f"/scrape?target=redis://127.0.0.1:{valkey.port}&check-keys=lmcv:*"
                                         "&check-single-keys=" + other)
        finally:
            sigterm_and_collect(proc)
        catcher.join(timeout=30)
        listener.close()
        assert "team-b" not in listed and "team-a" not in listed, [ln for ln in listed.splitlines() if "lmcv" in ln]
        (auth,) = heard
        words = re.findall(rb"\$\d+\r\n([^\r]*)\r\n", auth)
        assert words[0].upper() == b"AUTH", auth
        user, password = (w.decode() for w in words[1:3])
        refused = []
        for args in (("GET", other), ("GET", own), ("SCAN", "0"), ("KEYS", "*"), ("CONFIG", "GET", "masterauth"),
                     ("SLOWLOG", "GET"), ("CLIENT", "LIST"), ("SET", other, "x"), ("FLUSHALL",), ("ACL", "LIST")):
            try:
                r = valkey.cmd(*args, auth=(user, password))
            except Exception as e:  # noqa: BLE001 - error replies come back as exceptions
                r = e
            if not (isinstance(r, Exception) and "NOPERM" in str(r)):
                refused.append(f"{user} may run {args}: {r!r}")
        assert not refused, "\n".join(refused)
        assert valkey.cmd("GET", other, auth=ops) == b"theirs"


def test_exporter_sidecar_speaks_tls_with_the_secrets_ca(tmp_path):
    values = {"tls": {"enabled": True, "existingSecret": "lmcv-tls"}, "metrics": {"exporter": {"enabled": True}}}
    container = _container(values, "exporter")
    assert {"name": "tls", "mountPath": "/etc/valkey/tls", "readOnly": True} in container["volumeMounts"]
    tls = make_tls_files(tmp_path / "tls")
    with ValkeyServer(binary=DEBIAN_VALKEY, tls=tls) as valkey:
        proc, port = _run_exporter(container, valkey.port, {}, {"/etc/valkey/tls/ca.crt": tls.ca_file})
        try:
            text = _scrape(proc, port)
        finally:
            sigterm_and_collect(proc)
    assert re.search(r"^redis_up 1$", text, re.M), text[:2000]
