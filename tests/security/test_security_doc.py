"""docs/security.md's table of principals names, for every principal, the tests that show what
it can and cannot do: each named test exists (file and function, found by parsing the file,
not importing it: some need an engine this environment may lack), so the table cannot rot."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
PRINCIPALS = ("worker", "fabric worker", "tierd", "operator", "Valkey exporter", "another tenant", "a fabric peer")
_TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _table() -> dict[str, list[tuple[str, str]]]:
    """principal (first cell, up to any parenthesis) -> the tests its row names."""
    text = DOC.read_text()
    section = text[text.index("## What each principal can and cannot do"):]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, list[tuple[str, str]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("principal", "---"):
            continue
        rows[cells[0].split(" (")[0]] = _TEST_REF.findall(cells[3])
    return rows


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_principal_has_a_row_backed_by_tests():
    rows = _table()
    for principal in PRINCIPALS:
        assert principal in rows, f"docs/security.md has no row for {principal!r}: {sorted(rows)}"
        assert rows[principal], f"the row of {principal!r} names no test"


def test_every_test_the_doc_names_exists():
    refs = set(_TEST_REF.findall(DOC.read_text()))  # the table's and any other the doc names
    assert refs
    missing = []
    for file, name in sorted(refs):
        path = ROOT / file
        if not path.is_file() or name not in _test_functions(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
