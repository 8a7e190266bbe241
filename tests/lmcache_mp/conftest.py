import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from mphelp import managers  # noqa: E402

__all__ = ["managers"]  # a fixture: pytest finds it here
