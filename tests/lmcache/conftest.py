import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest_helpers import make_stack  # noqa: E402

__all__ = ["make_stack"]  # a fixture: pytest finds it here
