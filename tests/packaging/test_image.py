"""The image recipe and the pip user's path, from a built wheel in a fresh virtual environment.

The Dockerfile's build stage is a list of `bash /build.sh <step>` lines. Docker is not
available here, so these tests run the same lines on this machine (paths of the image mapped
into a temporary directory): a fresh venv, the wheel built from this tree, installed with the
s3 extra, the module built by the installed package. Then, as a user who only has that
environment: build the module, run doctor against a Valkey that loaded it, start tierd."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from support.procs import sigterm_and_collect
from support.servers import DEBIAN_VALKEY, ValkeyServer, free_port

import lmcache_valkey

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"

pytestmark = pytest.mark.timeout(900)


def build_stage_runs() -> list[str]:
    """The RUN commands of the Dockerfile's `build` stage, in order."""
    runs, stage = [], None
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            stage = m.group(1)
        elif stage == "build" and line.startswith("RUN "):
            runs.append(line[4:].strip())
    return runs


def test_every_build_step_is_the_one_script():
    runs = build_stage_runs()
    assert runs, "no build stage in the Dockerfile"
    for run in runs:
        assert re.fullmatch(r"(\w+=\S+ )*bash /build\.sh [\w-]+( \S+)*", run), run
    steps = [re.search(r"/build\.sh ([\w-]+)", r).group(1) for r in runs]
    assert steps == ["build-deps", "venv", "wheel", "install", "module", "check"]
    text = DOCKERFILE.read_text()
    assert "COPY --from=build /opt/lmcache-valkey /opt/lmcache-valkey" in text
    assert 'ENTRYPOINT ["lmcache-valkey"]' in text and "USER 999:999" in text


def test_the_build_packages_are_what_the_module_needs():
    printed = subprocess.run(["bash", str(ROOT / "docker/build.sh"), "build-deps", "--print"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    assert {"build-essential", "libfabric-dev", "python3-venv"} <= set(printed)
    valkey = subprocess.run(["bash", str(ROOT / "docker/build.sh"), "valkey-deps", "--print"], capture_output=True,
                            text=True, timeout=30, check=True).stdout.split()
    assert valkey == ["libfabric1"]


def _chart_image_paths() -> tuple[str, str]:
    import yaml

    values = yaml.safe_load((ROOT / "charts/lmcache-valkey/values.yaml").read_text())
    return values["tierd"]["image"]["repository"], values["valkey"]["module"]["initContainer"]["sourcePath"]


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """What the image's build stage leaves under /opt/lmcache-valkey, built here."""
    root = tmp_path_factory.mktemp("image")
    mapping = {"/build.sh": str(ROOT / "docker/build.sh"), "/src": str(ROOT), "/dist": str(root / "dist"),
               "/opt/lmcache-valkey": str(root / "opt/lmcache-valkey")}
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "cache"))
    env.pop("VIRTUAL_ENV", None)
    for run in build_stage_runs():
        if re.search(r"/build\.sh [\w-]+-deps\b", run):
            continue  # apt-get: scripts/setup.sh installed the same packages here
        assigns: dict[str, str] = {}
        argv: list[str] = []
        for word in shlex.split(run):
            name, eq, value = word.partition("=")
            if eq and not argv and name.isidentifier():  # VAR=value before the command
                assigns[name] = _mapped(value, mapping)
            else:
                argv.append(_mapped(word, mapping))
        r = subprocess.run(argv, cwd=root, env={**env, **assigns}, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{run}\n{r.stdout}\n{r.stderr}"
    return root / "opt/lmcache-valkey"


def _mapped(word: str, mapping: dict[str, str]) -> str:
    """An image path with its place on this machine (the longest image prefix wins)."""
    for image_path in sorted(mapping, key=len, reverse=True):
        if word == image_path or word.startswith(image_path + "/"):
            return mapping[image_path] + word[len(image_path):]
    return word


def _user_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def test_the_image_holds_the_cli_and_the_module_the_chart_uses(image_root):
    repository, module_path = _chart_image_paths()
    assert repository in DOCKERFILE.read_text()  # the image the chart pulls is this recipe's
    assert module_path == "/opt/lmcache-valkey/lmcv_blob.so"
    assert (image_root / "lmcv_blob.so").is_file() and os.access(image_root / "lmcv_blob.so", os.X_OK)
    out = subprocess.run([str(image_root / "venv/bin/lmcache-valkey"), "--version"], capture_output=True, text=True,
                         timeout=60, cwd="/")
    assert out.stdout.strip() == f"lmcache-valkey {lmcache_valkey.__version__}"
    site = next((image_root / "venv/lib").glob("python3*/site-packages"))
    assert (site / "lmcache_valkey/_endpoint/Makefile").is_file()  # the sources ride in the wheel
    assert not (site / "lmcache_valkey/_endpoint/build").exists()
    assert (site / "aiobotocore").is_dir()  # the s3 extra: tierd's cold tier
    assert not (site / "torch").exists() and not (site / "lmcache").exists()


@pytest.mark.parametrize("binary", [None, DEBIAN_VALKEY], ids=["valkey-9.1", "valkey-8.0"])
def test_the_images_module_loads_in_valkey(image_root, binary):
    if binary and not os.path.exists(binary):
        pytest.fail(f"{binary} is required (scripts/setup.sh installs it)")
    with ValkeyServer(binary=binary, args=["--loadmodule", str(image_root / "lmcv_blob.so"), "provider", "tcp;ofi_rxm",
                                           "bind", "127.0.0.1"]) as s:
        assert any(b"lmcvblob" in entry for entry in s.cmd("MODULE", "LIST"))


def test_a_pip_user_builds_the_module_runs_doctor_and_starts_tierd(image_root, tmp_path):
    """Only the fresh environment the wheel went into: no checkout, no repository paths."""
    cli = str(image_root / "venv/bin/lmcache-valkey")
    env = _user_env(tmp_path)
    r = subprocess.run([cli, "endpoint", "build", "--out", str(tmp_path / "mod")], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    so = Path(r.stdout.strip())
    assert str(so).startswith(str(tmp_path)) and so.is_file()
    assert "_endpoint" in r.stderr and str(ROOT) not in r.stderr  # built from the installed sources

    with ValkeyServer(args=["--loadmodule", str(so), "provider", "tcp;ofi_rxm", "bind", "127.0.0.1",
                            "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]) as valkey:
        r = subprocess.run([cli, "doctor", "--url", valkey.url, "--transport", "fabric", "--json"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        checks = {c["name"]: c for c in json.loads(r.stdout)}
        assert r.returncode == 0, checks
        for name in ("connect", "server", "memory", "acl", "modules", "fabric"):
            assert checks[name]["status"] == "ok", checks[name]

        port = free_port()
        tierd = subprocess.Popen([cli, "tierd", "--valkey-url", valkey.url, "--tenant", "t1",
                                  "--nvme-dir", str(tmp_path / "nvme"), "--nvme-budget-bytes", "1GiB",
                                  "--metrics-port", str(port), "--set", "request_block_s=0.2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                assert tierd.poll() is None and time.monotonic() < deadline, "tierd did not become healthy"
                time.sleep(0.2)
            r = subprocess.run([cli, "stats", "--url", valkey.url, "--tenant", "t1", "--timeout", "20"],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
            assert r.returncode == 0 and "of 1.0 GiB used" in r.stdout, r.stdout + r.stderr
        finally:
            out = sigterm_and_collect(tierd)
        assert tierd.returncode == 0, out
