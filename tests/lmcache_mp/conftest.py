import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from mphelp import managers  # noqa: E402,F401  (a fixture, found by pytest through this import)
