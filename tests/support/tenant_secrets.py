"""The tenant secret an example config names by its pod mount path, given here instead.

Every shipped example of a tenant other than ``default`` names ``tenant_secret_file`` (a
worker without a secret refuses to start, docs/security.md); a test that runs the example
as written swaps that path for an inline secret of the same tenant."""

from __future__ import annotations

from typing import Any, Mapping

TEST_TENANT_SECRET = "a-tenant-secret-of-32-characters"


def with_test_secret(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with its ``tenant_secret_file`` (a path that exists only in a pod)
    replaced by ``tenant_secret``; anything else unchanged."""
    out = dict(settings)
    if out.pop("tenant_secret_file", None) is not None:
        out["tenant_secret"] = TEST_TENANT_SECRET
    return out
