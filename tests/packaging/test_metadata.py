"""What a user installs: license, classifiers, URLs, version and requirements as ranges."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_is_an_spdx_expression_and_the_license_file_ships(wheel, wheel_metadata):
    assert wheel_metadata["License-Expression"] == "Apache-2.0"
    assert wheel_metadata.get("License") is None  # the deprecated free-text field
    assert wheel_metadata.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(wheel) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith("licenses/LICENSE"))).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert not [c for c in wheel_metadata.get_all("Classifier") if c.startswith("License ::")]


def test_classifiers_and_urls_tell_the_truth(wheel_metadata):
    classifiers = wheel_metadata.get_all("Classifier")
    versions = sorted(c.rsplit(":: ", 1)[1] for c in classifiers if re.match(r"Programming Language :: Python :: 3\.\d+$", c))
    assert versions == ["3.10", "3.11", "3.12", "3.13"]
    supported = SpecifierSet(wheel_metadata["Requires-Python"])
    assert [v for v in ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14") if supported.contains(v)] == versions
    urls = dict(u.split(", ", 1) for u in wheel_metadata.get_all("Project-URL"))
    assert {"Homepage", "Repository", "Issues", "Changelog", "Documentation"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())


def test_version_is_one_value_everywhere(wheel_metadata):
    import lmcache_valkey

    assert re.fullmatch(r"\d+\.\d+\.\d+", lmcache_valkey.__version__)
    assert wheel_metadata["Version"] == lmcache_valkey.__version__
    out = subprocess.run([sys.executable, "-m", "lmcache_valkey", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"lmcache-valkey {lmcache_valkey.__version__}"
    with open(ROOT / "charts/lmcache-valkey/Chart.yaml") as f:
        assert f'appVersion: "{lmcache_valkey.__version__}"' in f.read()


def test_requirements_are_ranges_and_never_pin_torch_or_lmcache(wheel_metadata):
    reqs = [Requirement(r) for r in wheel_metadata.get_all("Requires-Dist")]
    extras_only = {"test", "vllm-test", "sglang-test", "sglang-bench"}  # tooling for our own test environments
    for req in reqs:
        extra = re.search(r'extra == "([^"]+)"', str(req.marker or ""))
        if extra and extra.group(1) in extras_only:
            continue
        assert req.name != "torch", f"{req}: torch comes from the user's inference environment"
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req} is a pin, not a range"
    lmcache = [r for r in reqs if r.name == "lmcache"]
    assert lmcache and all(r.specifier.contains("0.5.6") for r in lmcache)


def test_ci_installs_exactly_the_cpu_torch_before_lmcache():
    """CI's exact versions live in one table; setup.sh installs torch alone first from it."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        ci = tomllib.load(f)["tool"]["lmcache-valkey"]["ci"]["constraints"]
    assert "torch==2.13.0" in ci and any(c.startswith("lmcache==") for c in ci)
    out = subprocess.run([sys.executable, str(ROOT / "scripts/pins.py"), "pin", "torch"], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "torch==2.13.0"
    setup = (ROOT / "scripts/setup.sh").read_text()
    torch_step = setup.index('"$(python3 scripts/pins.py pin torch)"')
    package_step = setup.index('-e ".[lmcache')
    assert torch_step < package_step
    assert "-c .venv/ci-constraints.txt -e" in setup


def test_the_wheel_ships_every_source_of_the_server_module(wheel):
    """`lmcache-valkey endpoint build` compiles what the wheel carries: all of endpoint/."""
    shipped = {n[len("lmcache_valkey/_endpoint/"):] for n in zipfile.ZipFile(wheel).namelist()
               if n.startswith("lmcache_valkey/_endpoint/")}
    tracked = subprocess.run(["git", "ls-files", "endpoint"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked and shipped == {p[len("endpoint/"):] for p in tracked}
