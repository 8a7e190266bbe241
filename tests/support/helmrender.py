"""Rendering the chart offline (Helm v4 SDK, no helm binary) and picking manifests by kind."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "lmcache-valkey"
RELEASE, NAMESPACE = "kv", "inference"
FULLNAME = f"{RELEASE}-lmcache-valkey"


def render(values: dict | None = None) -> dict[str, str]:
    import helm_python as helm

    chart = helm.Chart.load(str(CHART))
    return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(values: dict | None = None) -> list[dict]:
    out = []
    for path, text in render(values).items():
        if not path.endswith("NOTES.txt"):
            out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def render_error(values: dict) -> str:
    """The message `helm install` would stop with (the test fails if rendering succeeds)."""
    import helm_python as helm

    try:
        render(values)
    except helm.HelmError as e:
        return str(e)
    raise AssertionError(f"rendering succeeded with {values}")
