"""Prints what CI installs exactly, from pyproject.toml's [tool.lmcache-valkey.ci] table.

    python3 scripts/pins.py constraints          # one requirement a line (a pip -c file)
    python3 scripts/pins.py pin torch            # the one constraint for that project

Run with the system python3 (3.11+: tomllib); setup.sh and scripts/envs/*.sh call it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def constraints() -> list[str]:
    with PYPROJECT.open("rb") as f:
        return list(tomllib.load(f)["tool"]["lmcache-valkey"]["ci"]["constraints"])


def pin(project: str) -> str:
    for req in constraints():
        if re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower() == project.lower():
            return req
    raise SystemExit(f"no CI constraint for {project!r} in {PYPROJECT}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["constraints"]:
        print("\n".join(constraints()))
    elif argv[:1] == ["pin"] and len(argv) == 2:
        print(pin(argv[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
