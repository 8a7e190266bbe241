"""pyflakes finds undefined names hiding in error paths that tests rarely reach, and the
unused imports that make a reader look for a use that is not there: every Python file of
the project is clean."""

import pathlib

from pyflakes import api, reporter

ROOT = pathlib.Path(__file__).resolve().parents[2]
TREES = ("lmcache_valkey", "tests", "benchmarks", "scripts")
FILES = ("setup.py",)


class _Collect(reporter.Reporter):
    def __init__(self) -> None:
        self.found: list[str] = []

    def flake(self, message) -> None:  # noqa: D401
        self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:
        self.found.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg) -> None:
        self.found.append(f"{filename}: {msg}")


def _sources() -> list[pathlib.Path]:
    paths = [p for tree in TREES for p in (ROOT / tree).rglob("*.py")]
    return sorted(paths + [ROOT / f for f in FILES])


def test_every_python_file_is_pyflakes_clean():
    r = _Collect()
    for path in _sources():
        api.checkPath(str(path), r)
    assert not r.found, "\n".join(r.found)


def test_the_check_covers_the_package_tests_and_benchmarks():
    rel = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"lmcache_valkey/transport/fabric/transport.py", "tests/conftest.py",
            "benchmarks/bench_fabric.py", "scripts/pins.py"} <= rel
