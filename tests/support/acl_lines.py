"""ACL lines as the docs, the chart notes and the example configs print them, applied to a
real server: tests use exactly what a user copies."""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(r"^[#\s]*(user \S+ on .*)$")


def acl_lines(text: str) -> dict[str, str]:
    """``user <name> on ...`` lines found in ``text`` (comments and indentation stripped), by user."""
    out = {}
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if m:
            line = m.group(1).rstrip().rstrip("`")
            out[line.split()[1]] = line
    return out


def setuser(server: Any, line: str, password: str, name: str | None = None) -> str:
    """``ACL SETUSER`` with the words of an ACL-file ``line``; its ``>PLACEHOLDER`` becomes
    ``password``. Returns the user name."""
    words = line.split()
    assert words[0] == "user", line
    user = name or words[1]
    rules = [f">{password}" if w.startswith(">") else w for w in words[2:]]
    server.cmd("ACL", "SETUSER", user, "reset", *rules)
    return user
