"""Security tests: what a hostile tenant can and cannot do to the shared tier (docs/security.md)."""

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "tiering"))  # tierhelp: chunk values, moto
sys.path.insert(0, os.path.join(HERE, "..", "lmcache"))  # conftest_helpers: LMCache stacks

from conftest_helpers import make_stack  # noqa: E402,F401  (fixtures, found by pytest through these imports)
from tierhelp import moto_s3, nvme_dir  # noqa: E402,F401
