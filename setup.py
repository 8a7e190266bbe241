"""Build hook (everything else is in pyproject.toml): the reference Valkey module's C sources,
``endpoint/`` of the repository, travel in the wheel as package data ``lmcache_valkey/_endpoint/``
so that ``lmcache-valkey endpoint build`` works for pip users. MANIFEST.in puts them in the sdist."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ENDPOINT_FILES = ("Makefile", "README.md", "src/*.c", "src/*.h", "include/*.h")


class BuildPyWithEndpoint(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent / "endpoint"
        dest = Path(self.build_lib) / "lmcache_valkey" / "_endpoint"
        for pattern in ENDPOINT_FILES:
            for path in sorted(root.glob(pattern)):
                target = dest / path.relative_to(root)
                self.mkpath(str(target.parent))
                self.copy_file(str(path), str(target))


setup(cmdclass={"build_py": BuildPyWithEndpoint})
