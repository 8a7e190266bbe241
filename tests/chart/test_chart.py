"""Helm chart: strict lint, values.schema.json, offline render (Helm v4 SDK, no helm binary),
kubernetes-validate --strict on every rendered manifest, the NOTES snippet through LMCache's
own config loader, the Grafana dashboard's PromQL through promtool, and the rendered
valkey.conf / start.sh / probe.sh run against a real valkey-server."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) is not installed")
kv_utils = pytest.importorskip("kubernetes_validate.utils", reason="kubernetes-validate is not installed")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "lmcache-valkey"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
KUBE_VERSION = "1.30.0"
# CRDs that kubernetes-validate ships no schema for: prometheus-operator's ServiceMonitor and
# PrometheusRule (monitoring.coreos.com/v1), checked structurally in test_service_monitor_targets_metrics
# and tests/chart/test_chart_monitoring.py (promtool).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
RELEASE, NAMESPACE = "kv", "inference"


def _load_values(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _render(values: dict | None = None) -> dict[str, str]:
    chart = helm.Chart.load(str(CHART))
    return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def _docs(manifests: dict[str, str]) -> list[dict]:
    out = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def _kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


VALUE_SETS = [pytest.param({}, id="defaults")] + [
    pytest.param(_load_values(p), id=p.stem) for p in CI_VALUES
]


# --- lint / schema -----------------------------------------------------------------------------
@pytest.mark.parametrize("values", VALUE_SETS)
def test_lint_strict(values):
    report = helm.lint(str(CHART), values, strict=True, kube_version="v" + KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warning or error
    assert report["errors"] == [] and problems == [], report


def test_full_values_file_exists():
    assert (CHART / "ci" / "full-values.yaml") in CI_VALUES


@pytest.mark.parametrize("values", VALUE_SETS)
def test_values_pass_schema(values):
    helm.Chart.load(str(CHART)).validate_schema(values)


def test_defaults_match_schema_keys():
    """Every key in values.yaml is described by the schema (which forbids unknown keys)."""
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(chart.values)


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"valkey": {"port": "6379x"}}, "/valkey/port"),
        ({"valkey": {"port": 60000}}, "/valkey/port"),  # cluster bus would be > 65535
        ({"valkey": {"cluster": {"shards": "three"}}}, "/valkey/cluster/shards"),
        ({"valkey": {"cluster": {"shards": 2}}}, "/valkey/cluster/shards"),
        ({"valkey": {"mode": "sentinel"}}, "/valkey/mode"),
        ({"valkey": {"maxmemry": "1gb"}}, "maxmemry"),
        ({"valkey": {"maxmemory": 6}}, "/valkey/maxmemory"),
        ({"tierd": {"nvme": {"budgetBytes": "lots"}}}, "/tierd/nvme/budgetBytes"),
        ({"tierd": {"nvme": {"volume": {"type": "nfs"}}}}, "/tierd/nvme/volume/type"),
        ({"efa": {"enabled": "yes"}}, "/efa/enabled"),
        ({"auth": {"enabled": True, "existingSecret": ""}}, "/auth/existingSecret"),
        ({"tierd": {"s3": {"enabled": True, "bucket": ""}}}, "/tierd/s3/bucket"),
        ({"tierd": {"s3": {"irsaRoleArn": "my-role"}}}, "/tierd/s3/irsaRoleArn"),
        ({"client": {"transport": "rdma"}}, "/client/transport"),
    ],
)
def test_schema_rejects_wrong_values(bad, where):
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmValuesError) as exc:
        chart.validate_schema(bad)
    assert where in str(exc.value)
    # the same values fail render and strict lint, as `helm install` / `helm lint` would
    with pytest.raises(helm.HelmValuesError):
        chart.render(bad, name=RELEASE, namespace=NAMESPACE)
    assert helm.lint(str(CHART), bad, strict=True)["errors"]


# --- render + kubernetes-validate ----------------------------------------------------------------
@pytest.mark.parametrize("values", VALUE_SETS)
def test_rendered_manifests_validate_strict(values):
    docs = _docs(_render(values))
    assert docs
    checked = 0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        assert doc["metadata"]["namespace"] == NAMESPACE or doc["kind"] == "ConfigMap", doc["metadata"]
        try:
            kv_utils.validate(doc, KUBE_VERSION, strict=True)
        except kv_utils.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked >= 5


def test_only_known_crds_are_rendered():
    docs = _docs(_render(_load_values(CHART / "ci" / "full-values.yaml")))
    core = {"v1", "apps/v1", "batch/v1", "policy/v1", "networking.k8s.io/v1"}
    for doc in docs:
        assert doc["apiVersion"] in core or (doc["apiVersion"], doc["kind"]) in CRD_KINDS, doc["kind"]


def test_defaults_standalone_shape():
    docs = _docs(_render())
    (sts,) = _kind(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    pod = sts["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    assert names == ["valkey", "tierd"]
    valkey = pod["containers"][0]
    assert valkey["resources"]["limits"]["memory"] == "8Gi"
    assert "vpc.amazonaws.com/efa" not in valkey["resources"]["limits"]
    tierd = pod["containers"][1]
    assert tierd["command"] == ["lmcache-valkey"]
    args = tierd["args"]
    assert args[:3] == ["tierd", "--valkey-url", "valkey://127.0.0.1:6379"]
    assert args[args.index("--nvme-budget-bytes") + 1] == "100000000000"
    assert args[args.index("--metrics-port") + 1] == "9400"
    assert "--s3-bucket" not in args
    assert args[args.index("--tenant") + 1] == "default"
    assert tierd["livenessProbe"]["httpGet"]["path"] == "/healthz"
    claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
    assert claims == ["nvme"]
    assert _kind(docs, "Job") == [] and _kind(docs, "NetworkPolicy") == []
    (cm,) = [c for c in _kind(docs, "ConfigMap")]
    conf = cm["data"]["valkey.conf"]
    assert "maxmemory 6gb" in conf and "maxmemory-policy allkeys-lru" in conf
    assert "cluster-enabled" not in conf
    assert "MODULE_PATH" not in {e["name"] for e in valkey["env"]}


def test_full_values_shape():
    docs = _docs(_render(_load_values(CHART / "ci" / "full-values.yaml")))
    (sts,) = _kind(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 6  # 3 shards x (1 + 1 replica)
    pod = sts["spec"]["template"]["spec"]
    valkey = pod["containers"][0]
    res = valkey["resources"]
    for part in ("limits", "requests"):
        assert res[part]["vpc.amazonaws.com/efa"] == 4
        assert res[part]["hugepages-2Mi"] == "4Gi"
    assert "IPC_LOCK" in valkey["securityContext"]["capabilities"]["add"]
    assert pod["initContainers"][0]["name"] == "copy-module"
    ports = {p["name"]: p["containerPort"] for p in valkey["ports"]}
    assert ports == {"valkey": 6379, "cluster-bus": 16379}
    tierd = pod["containers"][1]
    args = tierd["args"]
    assert args[2].startswith("valkeys://127.0.0.1:6379?tls_ca_file=/etc/valkey/tls/ca.crt")
    assert args[args.index("--s3-bucket") + 1] == "my-kv-cache"
    assert args[args.index("--s3-prefix") + 1] == "prod/llama-70b/"
    assert args[args.index("--s3-region") + 1] == "us-west-2"
    assert args[args.index("--tenant") + 1] == "team-a"
    assert args[-4:] == ["--admission", "frequency", "--flush-queue-max", "4096"]
    assert tierd["envFrom"] == [{"secretRef": {"name": "lmcv-s3"}}]
    env = {e["name"]: e for e in tierd["env"]}
    assert env["LMCACHE_VALKEY_USERNAME"]["value"] == "lmcv-tierd"  # its own user, confined to its tenant
    assert env["LMCACHE_VALKEY_PASSWORD_FILE"]["value"] == "/etc/valkey/acl/tierd-password"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["acl"]["secret"]["secretName"] == "lmcv-acl"
    assert volumes["tls"]["secret"]["secretName"] == "lmcv-tls"
    assert volumes["hugepages"]["emptyDir"]["medium"] == "HugePages"
    claims = {c["metadata"]["name"]: c for c in sts["spec"]["volumeClaimTemplates"]}
    assert claims["nvme"]["spec"]["storageClassName"] == "local-nvme"
    assert set(claims) == {"data", "nvme"}
    (sa,) = _kind(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(":role/lmcache-valkey")
    (job,) = _kind(docs, "Job")
    assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    (cm,) = [c for c in _kind(docs, "ConfigMap") if "valkey.conf" in c["data"]]
    conf = cm["data"]["valkey.conf"]
    for line in ("cluster-enabled yes", "tls-port 6379", "port 0", "aclfile /etc/valkey/acl/users.acl",
                 "io-threads 4"):
        assert line in conf.splitlines(), line
    env = {e["name"]: e.get("value") for e in valkey["env"]}
    assert env["MODULE_PATH"] == "/modules/lmcv_blob.so"
    assert env["MODULE_ARGS"] == "bind $(POD_IP) require_proof yes provider efa arena_mb 16384"
    assert "--cluster-replicas 1" in cm["data"]["cluster-init.sh"]
    (dash,) = [c for c in _kind(docs, "ConfigMap") if "lmcache-valkey.json" in c["data"]]
    assert dash["metadata"]["namespace"] == "monitoring"
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dash["data"]["lmcache-valkey.json"])
    (pdb,) = _kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    (np,) = _kind(docs, "NetworkPolicy")
    ports = [p["port"] for rule in np["spec"]["ingress"] for p in rule["ports"]]
    assert {6379, 16379, 9400, 30000} <= set(ports)


@pytest.mark.parametrize("require_proof, word", [(True, "yes"), (False, "no")])
def test_the_module_is_told_its_peer_mode_either_way(require_proof, word):
    """requireProof is passed as require_proof yes or no: false must reach the module as an
    explicit "no" (its own default is yes), never as a missing argument."""
    values = {"valkey": {"module": {"enabled": True, "requireProof": require_proof}}}
    (sts,) = _kind(_docs(_render(values)), "StatefulSet")
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert f"require_proof {word}" in env["MODULE_ARGS"], env["MODULE_ARGS"]


def test_hostpath_nvme_and_module_from_image():
    docs = _docs(_render(_load_values(CHART / "ci" / "hostpath-values.yaml")))
    (sts,) = _kind(docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["nvme"]["hostPath"]["path"] == "/mnt/nvme0/lmcache-valkey"
    assert "volumeClaimTemplates" not in sts["spec"]
    args = pod["containers"][1]["args"]
    assert args[args.index("--s3-endpoint-url") + 1] == "https://minio.storage.svc:9000"
    assert "envFrom" not in pod["containers"][1]
    assert _kind(docs, "PodDisruptionBudget") == []


def test_service_monitor_targets_metrics():
    values = _load_values(CHART / "ci" / "full-values.yaml")
    docs = _docs(_render(values))
    (sm,) = _kind(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["metadata"]["namespace"] == "monitoring"  # metrics.serviceMonitor.namespace
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]  # still scrapes the release's Service
    endpoints = {e["port"]: e for e in sm["spec"]["endpoints"]}
    assert set(endpoints) == {"metrics", "exporter"}  # tierd and the Valkey exporter
    for endpoint in endpoints.values():
        assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
        assert endpoint["relabelings"] == values["metrics"]["serviceMonitor"]["relabelings"]
        assert endpoint["metricRelabelings"][0]["action"] == "drop"
    selector = sm["spec"]["selector"]["matchLabels"]
    matching = [s for s in _kind(docs, "Service") if selector.items() <= s["metadata"]["labels"].items()]
    assert len(matching) == 1, "exactly one Service (the client one) is scraped"
    assert {"metrics", "exporter"} <= {p["name"] for p in matching[0]["spec"]["ports"]}


# --- NOTES: the LMCache snippet loads with LMCache's own loader ---------------------------------
def _notes_snippet(values: dict) -> str:
    notes = _render(values)["lmcache-valkey/templates/NOTES.txt"]
    m = re.search(r"----8<----\n(.*?)---->8----", notes, re.S)
    assert m, notes
    return m.group(1)


@pytest.mark.parametrize("values", VALUE_SETS)
def test_notes_snippet_loads_in_lmcache(values, tmp_path):
    config_mod = pytest.importorskip("lmcache.v1.config", reason="lmcache (extra 'lmcache') is not installed")
    from lmcache_valkey.config import KNOWN_KEYS, LMCACHE_OWN_KEYS
    from lmcache_valkey.tiering.settings import KNOWN_KEYS as TIERING_KEYS

    path = tmp_path / "lmcache.yaml"
    path.write_text(_notes_snippet(values))
    cfg = config_mod.LMCacheEngineConfig.from_file(str(path))
    assert cfg.remote_storage_plugins == ["valkey"]
    assert cfg.remote_url is None  # a remote_url would add a second RemoteBackend in LMCache 0.5
    assert cfg.remote_serde == "naive"
    extra = cfg.extra_config
    pre = "remote_storage_plugin.valkey."
    assert extra[pre + "module_path"] == "lmcache_valkey.integrations.lmcache.adapter"
    assert extra[pre + "class_name"] == "ValkeyConnectorAdapter"
    ours = {k[len(pre):] for k in extra if k.startswith(pre)}
    known = KNOWN_KEYS | TIERING_KEYS | LMCACHE_OWN_KEYS
    assert ours <= known, ours - known
    url = extra[pre + "url"]
    assert url.startswith("valkeys://" if values.get("tls", {}).get("enabled") else "valkey://")
    assert f".{NAMESPACE}.svc.cluster.local:6379" in url


@pytest.mark.parametrize("tierd", [True, False])
def test_notes_snippet_sends_workers_to_tierd_when_it_runs(tierd):
    """Workers that follow the install notes use tierd (NVMe/S3 tiers, promotion) when the chart
    runs it, and say nothing about tiering when it does not."""
    from lmcache_valkey.settings import load_settings, plugin_keys, plugin_prefix

    extra = yaml.safe_load(_notes_snippet({"tierd": {"enabled": tierd}}))["extra_config"]
    raw = {k: v for k, v in plugin_keys(extra, "valkey").items() if k not in ("module_path", "class_name")}
    raw.pop("password_file", None)
    settings, tiering = load_settings(raw, key_prefix=plugin_prefix("valkey"), env={})
    assert tiering.mode == ("service" if tierd else "off")
    assert settings.tenant == "default"  # the tenant tierd serves (tierd.tenant) by default


def test_notes_warn_when_tierd_serves_another_tenant_than_the_workers():
    notes = _render({"tierd": {"tenant": "t-other"}, "client": {"tenant": "t1"}})["lmcache-valkey/templates/NOTES.txt"]
    assert "tierd serves tenant \"t-other\"" in notes and "workers of tenant \"t1\"" in notes


# --- Grafana dashboard ---------------------------------------------------------------------------
def _dashboard_exprs() -> list[str]:
    dash = json.loads((CHART / "dashboards" / "lmcache-valkey.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    titles = " | ".join(p["title"] for p in dash["panels"])
    for want in ("Hit rate by tier", "Retrieved bytes by tier", "latency p50 / p99", "Flush backlog", "breaker"):
        assert want.lower() in titles.lower(), want
    return exprs


def test_dashboard_queries_use_real_metrics():
    from lmcache_valkey import metrics

    # every family the module defines, with the sample suffixes each type exposes
    exposed = set()
    for obj in vars(metrics).values():
        if isinstance(obj, type):
            continue
        for family in getattr(obj, "describe", lambda: [])():
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
            exposed.update(family.name + sfx for sfx in suffixes)
    assert "lmcache_valkey_hits_total" in exposed
    for expr in _dashboard_exprs():
        for name in set(re.findall(r"\blmcache_valkey_[a-z_]+", expr)):
            assert name in exposed, f"{name} in {expr!r} is not a metric we export"


def test_dashboard_promql_parses(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run scripts/setup.sh (Debian package 'prometheus')")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"lmcv:dashboard:expr{i}", "expr": e.replace("$__rate_interval", "5m").replace("$namespace", ".*")}
        for i, e in enumerate(_dashboard_exprs())
    ]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


# --- the rendered Valkey config and scripts against a real valkey-server -------------------------
def _free_port() -> int:
    """A free port whose cluster-bus twin (+10000) is a valid port too."""
    for _ in range(200):
        port = random.randint(20000, 55000)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair")


VALKEY_SERVER = shutil.which("valkey-server")
VALKEY_CLI = shutil.which("valkey-cli")


class _Pod:
    """The chart's valkey container, run locally: same config, start.sh and probe.sh."""

    def __init__(self, tmp: Path, values: dict, env: dict | None = None, files: dict | None = None,
                 port: int | None = None, ip: str = "127.0.0.1", name: str = "lmcv-0"):
        self.port = port or _free_port()
        self.ip = ip
        values = copy.deepcopy(values)
        values.setdefault("valkey", {})["port"] = self.port
        docs = _docs(_render(values))
        (cm,) = [c for c in _kind(docs, "ConfigMap") if "valkey.conf" in c["data"]]
        (sts,) = _kind(docs, "StatefulSet")
        (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "valkey"]
        self.tmp = tmp
        etc, run, data = tmp / "etc", tmp / "run", tmp / "data"
        for d in (etc, run, data):
            d.mkdir(parents=True, exist_ok=True)

        def localize(text: str) -> str:
            text = text.replace("/etc/valkey/", f"{etc}/").replace("/run/valkey", str(run))
            return re.sub(r"(?<![\w/])/data\b", str(data), text)

        for fname, text in cm["data"].items():
            (etc / fname).write_text(localize(text))
        for fname, text in (files or {}).items():
            (etc / fname).parent.mkdir(parents=True, exist_ok=True)
            (etc / fname).write_text(text)
        self.etc = etc
        # the container's environment as the kubelet would build it: fieldRefs resolved,
        # $(VAR) expanded; secret-backed values come from ``env``
        field_refs = {"metadata.name": name, "status.podIP": ip}
        pod_env: dict[str, str] = {}
        for e in container.get("env", []):
            if "value" in e:
                pod_env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: pod_env.get(m.group(1), m.group(0)), e["value"])
            elif "fieldRef" in e.get("valueFrom", {}):
                pod_env[e["name"]] = field_refs[e["valueFrom"]["fieldRef"]["fieldPath"]]
        pod_env.update(env or {})
        self.env = {**os.environ, **{k: localize(v) for k, v in pod_env.items()}}
        self.log = open(tmp / "valkey.log", "wb")
        # bind to loopback only in tests; the command line overrides valkey.conf
        self.proc = subprocess.Popen(
            # (bind-source-addr: outgoing cluster-bus links leave from the pod's own address)
            ["/bin/sh", str(etc / "start.sh"), "--bind", ip, "--bind-source-addr", ip],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def probe(self, kind: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", str(self.etc / "probe.sh"), kind], env={**self.env, **(env or {})},
                              capture_output=True, timeout=30)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30  # a hung server, not a speed threshold
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("valkey-server exited: " + (self.tmp / "valkey.log").read_text()[-3000:])
            # probe.sh asks 127.0.0.1 (a pod binds every address); other loopback IPs: PING
            ready = self.probe("ready").returncode == 0 if self.ip == "127.0.0.1" else self.cli("ping").strip() == "PONG"
            if ready:
                return
            time.sleep(0.1)
        pytest.fail("valkey-server never answered the readiness probe: " + (self.tmp / "valkey.log").read_text()[-3000:])

    def cli(self, *args: str) -> str:
        out = subprocess.run([VALKEY_CLI, "-h", self.ip, "-p", str(self.port), *args], env=self.env,
                             capture_output=True, timeout=30)
        return out.stdout.decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.log.close()


@pytest.fixture
def pod_factory(tmp_path):
    if VALKEY_SERVER is None or VALKEY_CLI is None:
        pytest.fail("valkey-server/valkey-cli not found: run scripts/setup.sh (valkey-server, valkey-tools)")
    pods = []

    def make(values: dict, **kw) -> _Pod:
        pod = _Pod(tmp_path / f"pod{len(pods)}", values, **kw)
        pods.append(pod)
        return pod

    yield make
    for pod in pods:
        pod.stop()


def test_rendered_config_runs_standalone(pod_factory):
    pod = pod_factory({"valkey": {"maxmemory": "64mb", "maxmemoryPolicy": "allkeys-lfu"}})
    pod.wait_ready()
    assert pod.probe("live").returncode == 0
    assert pod.cli("config", "get", "maxmemory").split() == ["maxmemory", str(64 * 1024 * 1024)]
    assert pod.cli("config", "get", "maxmemory-policy").split() == ["maxmemory-policy", "allkeys-lfu"]
    assert pod.cli("config", "get", "proto-max-bulk-len").split()[1] == str(512 * 1024 * 1024)
    assert pod.cli("config", "get", "save").split() == ["save"]


def test_rendered_config_runs_with_acl(pod_factory):
    from lmcache_valkey import acl as lines

    acl = "\n".join(["user default off", lines.operator_line("lmcv-ops", password="ops-secret"),
                     lines.worker_line("team-a", "team-a", password="a-secret")]) + "\n"
    values = {"auth": {"enabled": True, "existingSecret": "lmcv-acl"}}
    env = {"REDISCLI_AUTH": "ops-secret"}  # from the Secret in a pod
    pod = pod_factory(values, env=env, files={"acl/users.acl": acl, "acl/ops-password": "ops-secret\n"})
    pod.wait_ready()
    # the replication credentials were written for replicas
    assert 'masterauth "ops-secret"' in (pod.tmp / "run" / "runtime.conf").read_text()
    # the probe reports a wrong password instead of passing
    bad = pod.probe("ready", env={"REDISCLI_AUTH": "wrong"})
    assert bad.returncode == 1 and b"WRONGPASS" in bad.stdout + bad.stderr
    # the tenant user is confined to its namespace
    as_a = ["--user", "team-a", "--pass", "a-secret", "--no-auth-warning"]
    assert pod.cli(*as_a, "set", "lmcv:team-a:x", "1").strip() == "OK"
    assert "NOPERM" in pod.cli(*as_a, "set", "lmcv:team-b:x", "1")


def test_rendered_config_runs_cluster_mode(pod_factory):
    pod = pod_factory({"valkey": {"mode": "cluster"}})
    pod.wait_ready()
    assert "cluster_enabled:1" in pod.cli("info", "cluster")
    announced = f"lmcv-0.{RELEASE}-lmcache-valkey-headless.{NAMESPACE}.svc.cluster.local"
    assert f"cluster-announce-hostname {announced}" in (pod.tmp / "run" / "runtime.conf").read_text()
    assert (pod.tmp / "data" / "nodes.conf").exists()


def test_rendered_config_loads_reference_module(pod_factory):
    module = ROOT / "endpoint" / "build" / "lmcv_blob.so"
    if not module.exists():
        pytest.skip("endpoint/build/lmcv_blob.so not built (make -C endpoint)")
    values = {"valkey": {"module": {"enabled": True, "source": "image", "path": str(module),
                                    "args": ["provider", "tcp;ofi_rxm", "arena_mb", 64]}}}
    pod = pod_factory(values)
    pod.wait_ready()
    assert "lmcv" in pod.cli("module", "list").lower()
    # the fabric endpoint was bound to the pod IP (127.0.0.1 here) from MODULE_ARGS
    runtime = (pod.tmp / "run" / "runtime.conf").read_text()
    assert f"loadmodule {module} bind 127.0.0.1 require_proof yes provider tcp;ofi_rxm arena_mb 64" in runtime
    # No client may claim a fabric address (another worker's) without proving it owns it.
    assert "NOPROOF" in pod.cli("BLOB.RDMA_HELLO", "02001f90" + "7f000001" + "00" * 8)


# --- the chart's tierd command line is one the real CLI accepts ---------------------------------
@pytest.mark.parametrize("values", VALUE_SETS)
def test_tierd_args_parse_with_the_real_cli(values, tmp_path):
    from lmcache_valkey.cli import build_parser
    from lmcache_valkey.config import parse_url

    (sts,) = _kind(_docs(_render(values)), "StatefulSet")
    tierds = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "tierd"]
    if values.get("tierd", {}).get("enabled") is False:
        assert tierds == []
        return
    (tierd,) = tierds
    assert tierd["command"] == ["lmcache-valkey"]
    args = build_parser().parse_args(tierd["args"])
    assert args.command == "tierd"
    assert args.metrics_port == 9400
    nodes, tls, *_ = parse_url(args.valkey_url)
    assert [(n.host, n.port) for n in nodes] == [("127.0.0.1", 6379)]
    assert tls == bool(values.get("tls", {}).get("enabled"))
    from lmcache_valkey.tiering.tierd import settings_from_tierd_args

    ca = tmp_path / "ca.crt"  # the pod mounts it; here a file must exist at the path the URL names
    ca.write_text("")
    args.valkey_url = re.sub(r"tls_ca_file=[^&]+", f"tls_ca_file={ca}", args.valkey_url)
    settings, ts = settings_from_tierd_args(args)
    assert settings.tenant == values.get("tierd", {}).get("tenant", "default")
    want = values.get("tierd", {}).get("nvme", {}).get("budgetBytes", 100000000000)
    assert ts.nvme_budget_bytes == want


def _free_port_on(ips: list[str]) -> int:
    for _ in range(200):
        port = random.randint(20000, 55000)
        socks = []
        try:
            for ip in ips:
                for p in (port, port + 10000):
                    s = socket.socket()
                    socks.append(s)
                    s.bind((ip, p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port")


def test_cluster_init_job_forms_the_cluster(pod_factory, tmp_path):
    """The Job's cluster-init.sh against six pods of the rendered config (one loopback address
    per pod, same port, like pod IPs); getent/valkey-cli see pod DNS names through a shim."""
    values = {"valkey": {"mode": "cluster", "cluster": {"shards": 3, "replicasPerShard": 1}}}
    ips = [f"127.0.0.{i + 2}" for i in range(6)]
    port = _free_port_on(ips)
    values["valkey"]["port"] = port
    full, headless = f"{RELEASE}-lmcache-valkey", f"{RELEASE}-lmcache-valkey-headless"
    names = {f"{full}-{i}.{headless}.{NAMESPACE}.svc.cluster.local": ip for i, ip in enumerate(ips)}
    pods = [pod_factory(values, port=port, ip=ip, name=f"{full}-{i}") for i, ip in enumerate(ips)]
    for pod in pods:
        pod.wait_ready()

    shim = tmp_path / "bin"
    shim.mkdir()
    cases = "\n".join(f"    {n}) a={ip} ;;" for n, ip in names.items())
    (shim / "getent").write_text(
        "#!/bin/sh\n" + "".join(f'[ "$2" = {n} ] && echo "{ip} $2" && exit 0\n' for n, ip in names.items()) + "exit 2\n")
    (shim / "valkey-cli").write_text(
        "#!/bin/sh\nprev=\nfor a in \"$@\"; do\n  if [ \"$prev\" = -h ]; then\n  case \"$a\" in\n"
        f"{cases}\n  esac\n  fi\n  prev=$a\n  set -- \"$@\" \"$a\"\n  shift\ndone\n"
        f'exec {VALKEY_CLI} "$@"\n')
    for f in shim.iterdir():
        f.chmod(0o755)
    (cm,) = [c for c in _kind(_docs(_render(values)), "ConfigMap") if "valkey.conf" in c["data"]]
    script = tmp_path / "cluster-init.sh"
    script.write_text(cm["data"]["cluster-init.sh"])
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    try:
        first = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"cluster-init.sh hung: {(exc.stdout or b'')[-1500:]!r}\n" + pods[0].cli("cluster", "nodes"))
    assert first.returncode == 0, (first.stdout + first.stderr).decode()[-3000:]
    deadline = time.monotonic() + 60  # gossip convergence; a timeout, not a speed check
    while "cluster_state:ok" not in (info := pods[0].cli("cluster", "info")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "cluster_state:ok" in info and "cluster_known_nodes:6" in info and "cluster_size:3" in info, info
    roles = [p.cli("role").split()[0] for p in pods]
    assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
    # post-upgrade: the Job runs again and leaves the formed cluster alone
    again = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, timeout=120)
    assert again.returncode == 0 and b"already formed" in again.stdout, (again.stdout + again.stderr).decode()


def test_rendered_config_runs_with_tls(pod_factory, tmp_path):
    from support.servers import make_tls_files

    tls = make_tls_files(tmp_path / "certs")
    files = {f"tls/{k}": Path(v).read_text() for k, v in
             (("ca.crt", tls.ca_file), ("tls.crt", tls.cert_file), ("tls.key", tls.key_file))}
    pod = pod_factory({"tls": {"enabled": True, "existingSecret": "lmcv-tls"}}, files=files)
    pod.wait_ready()  # probe.sh speaks TLS with the Secret's CA
    assert "tls-port" in pod.cli("--tls", "--cacert", str(pod.etc / "tls" / "ca.crt"), "config", "get", "tls-port")
    plain = subprocess.run([VALKEY_CLI, "-h", "127.0.0.1", "-p", str(pod.port), "ping"], capture_output=True, timeout=30)
    assert b"PONG" not in plain.stdout  # no plaintext port


# --- ACL: the notes print the allow-lists; tierd runs as its own confined user ------------------
AUTH_VALUES = {"auth": {"enabled": True, "existingSecret": "lmcv-acl"},
               "tierd": {"tenant": "team-a"}, "client": {"tenant": "team-a", "username": "team-a-workers"}}


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
def test_notes_print_one_allow_list_per_principal(mode):
    from lmcache_valkey import acl
    from support.acl_lines import acl_lines

    values = copy.deepcopy(AUTH_VALUES)
    values["valkey"] = {"mode": mode}
    lines = acl_lines(_render(values)["lmcache-valkey/templates/NOTES.txt"])
    cluster = mode == "cluster"
    assert "  user default off" in _render(values)["lmcache-valkey/templates/NOTES.txt"].splitlines()
    assert lines == {
        "lmcv-ops": acl.operator_line("lmcv-ops", password="OPS_PASSWORD"),
        "lmcv-tierd": acl.tierd_line("lmcv-tierd", "team-a", password="TIERD_PASSWORD", cluster=cluster),
        "team-a-workers": acl.worker_line("team-a-workers", "team-a", tiering=True, cluster=cluster),
    }
    values["metrics"] = {"exporter": {"enabled": True}}  # its own statistics-only user
    lines = acl_lines(_render(values)["lmcache-valkey/templates/NOTES.txt"])
    assert lines["lmcv-monitor"] == acl.monitor_line("lmcv-monitor", cluster=cluster)
    snippet = yaml.safe_load(_notes_snippet(values))["extra_config"]
    assert snippet["remote_storage_plugin.valkey.cluster"] == ("yes" if cluster else "no")
    # with the module loaded, workers on transport auto or fabric take the large-object path
    values["valkey"]["module"] = {"enabled": True}
    for transport, fabric in (("auto", True), ("fabric", True), ("blob-tcp", True), ("tcp", False)):
        values["client"] = {**AUTH_VALUES["client"], "transport": transport}
        lines = acl_lines(_render(values)["lmcache-valkey/templates/NOTES.txt"])
        assert lines["team-a-workers"] == acl.worker_line("team-a-workers", "team-a", tiering=True, cluster=cluster,
                                                          fabric=fabric), transport


def test_notes_warn_that_an_install_without_auth_is_open_to_every_pod():
    notes = _render({})["lmcache-valkey/templates/NOTES.txt"]
    assert "WARNING: auth.enabled=false" in notes and "any pod in the cluster" in notes
    assert "networkPolicy.enabled=true" in notes
    fenced = _render({"networkPolicy": {"enabled": True}})["lmcache-valkey/templates/NOTES.txt"]
    assert "WARNING: auth.enabled=false" in fenced and "any pod in the cluster" not in fenced
    assert "WARNING: auth.enabled=false" not in _render(AUTH_VALUES)["lmcache-valkey/templates/NOTES.txt"]


def test_tierd_runs_as_its_own_tenant_confined_user(pod_factory, tmp_path):
    notes = _render(AUTH_VALUES)["lmcache-valkey/templates/NOTES.txt"]
    passwords = {"OPS_PASSWORD": "ops-secret", "TIERD_PASSWORD": "tierd-secret", "PASSWORD": "a-secret"}
    acl_file = "\n".join(re.sub(r">(\w+)", lambda m: ">" + passwords[m.group(1)], line)
                         for line in notes.splitlines() if line.strip().startswith("user ")) + "\n"
    files = {"acl/users.acl": acl_file, "acl/ops-password": "ops-secret\n", "acl/tierd-password": "tierd-secret\n"}
    pod = pod_factory(AUTH_VALUES, env={"REDISCLI_AUTH": "ops-secret"}, files=files)
    pod.wait_ready()
    values = copy.deepcopy(AUTH_VALUES)
    values["valkey"] = {"port": pod.port}
    (sts,) = _kind(_docs(_render(values)), "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    (tierd,) = [c for c in spec["containers"] if c["name"] == "tierd"]
    mounts = {m["name"]: m["mountPath"] for m in tierd["volumeMounts"]}
    assert "acl" not in mounts  # only its own password, not the ACL file with everyone's
    (vol,) = [v for v in spec["volumes"] if v["name"] == "tierd-password"]
    assert [i["key"] for i in vol["secret"]["items"]] == ["tierd-password"]
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    metrics = _free_port()
    args = [a.replace(tierd["args"][tierd["args"].index("--nvme-dir") + 1], str(nvme)) for a in tierd["args"]]
    args[args.index("--metrics-port") + 1] = str(metrics)
    env = {e["name"]: e["value"].replace(mounts["tierd-password"], str(pod.etc / "acl"))
           for e in tierd["env"] if "value" in e}
    exe = Path(sys.executable).with_name("lmcache-valkey")
    log = tmp_path / "tierd.log"
    proc = subprocess.Popen([str(exe), *args], env={**os.environ, **env}, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60  # start-up of a hung process, not a speed check
        users: set[str] = set()
        ops = ["--user", "lmcv-ops", "--pass", "ops-secret", "--no-auth-warning"]
        clients: list[dict[str, str]] = []
        while "lmcv-tierd" not in users:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            clients = [dict(f.split("=", 1) for f in line.split() if "=" in f)
                       for line in pod.cli(*ops, "client", "list").splitlines() if line.strip()]
            users = {c["user"] for c in clients}
            time.sleep(0.2)
        # tierd's connections, and this one; a connection tierd has just opened shows as
        # `default` until its AUTH lands (default is off: it can run nothing but AUTH/HELLO)
        assert users - {"default"} == {"lmcv-tierd", "lmcv-ops"}, clients
        assert all(c["cmd"] in ("NULL", "auth", "hello") for c in clients if c["user"] == "default"), clients
        assert "OK" in pod.cli(*ops, "acl", "dryrun", "lmcv-tierd", "get", "lmcv:team-a:x")
        assert "no permissions" in pod.cli(*ops, "acl", "dryrun", "lmcv-tierd", "get", "lmcv:team-b:x")
        assert "no permissions" in pod.cli(*ops, "acl", "dryrun", "lmcv-tierd", "flushall")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
