"""Security tests: what a hostile tenant can and cannot do to the shared tier (docs/security.md)."""

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "tiering"))  # tierhelp: chunk values, moto
sys.path.insert(0, os.path.join(HERE, "..", "lmcache"))  # conftest_helpers: LMCache stacks

from conftest_helpers import make_stack  # noqa: E402
from tierhelp import moto_s3, nvme_dir  # noqa: E402

__all__ = ["make_stack", "moto_s3", "nvme_dir"]  # fixtures: pytest finds them here
