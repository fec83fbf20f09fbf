"""The release artefacts, built as a release is: ``python -m build`` then ``twine check``.

A maintainer publishes what ``python -m build`` makes, so these tests build it (in a
temporary directory, with build's isolated environment: the same backend a release
gets) and read the archives, rather than trusting the configuration files: a LICENSE
declared but not shipped, an sdist whose tests cannot run, or a README that PyPI
cannot render would all pass a look at pyproject.toml.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import scrapy_redisspine

if TYPE_CHECKING:
    from email.message import Message

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parent.parent
# What the sdist must carry beside the package, so its tests run from the archive.
SOURCE_TREES = ("tests", "example_project", "benchmarks")
_SKIPPED_PARTS = {"__pycache__", ".scrapy", ".pytest_cache"}


class Dist:
    """The sdist and wheel of one build, and their names inside the archives."""

    def __init__(self, outdir: Path) -> None:
        (self.sdist,) = outdir.glob("*.tar.gz")
        (self.wheel,) = outdir.glob("*.whl")
        with tarfile.open(self.sdist) as archive:
            names = archive.getnames()
            top = names[0].split("/")[0]
            self.sdist_files = {n.removeprefix(top + "/") for n in names if n != top}
            license_member = archive.extractfile(f"{top}/LICENSE")
            assert license_member is not None
            self.sdist_license = license_member.read().decode()
        with zipfile.ZipFile(self.wheel) as archive:
            self.wheel_files = set(archive.namelist())
            metadata_name = next(n for n in self.wheel_files if n.endswith(".dist-info/METADATA"))
            self.metadata: Message = HeaderParser().parsestr(archive.read(metadata_name).decode())
            license_name = next(
                n for n in self.wheel_files if n.endswith(".dist-info/licenses/LICENSE")
            )
            self.wheel_license = archive.read(license_name).decode()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    outdir = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, f"python -m build failed:\n{result.stdout[-3000:]}\n" \
        f"{result.stderr[-3000:]}"
    return Dist(outdir)


def test_twine_check_strict_passes(dist: Dist) -> None:
    """PyPI's own checks: metadata complete, the README renders (warnings are errors)."""
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist.sdist), str(dist.wheel)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_license_ships_in_sdist_and_wheel(dist: Dist) -> None:
    assert dist.metadata["License-Expression"] == "BSD-3-Clause"
    for text in (dist.sdist_license, dist.wheel_license):
        assert text == (ROOT / "LICENSE").read_text()
        assert text.startswith("BSD 3-Clause License")
        assert "the scrapy-redisspine authors" in text


def _tree_files(name: str) -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / name).rglob("*")
        if path.is_file()
        and not _SKIPPED_PARTS.intersection(path.relative_to(ROOT).parts)
        and path.suffix not in {".pyc", ".aof", ".rdb"}
    }


@pytest.mark.parametrize("tree", SOURCE_TREES)
def test_sdist_carries_the_source_tree(dist: Dist, tree: str) -> None:
    expected = _tree_files(tree)
    assert expected, f"{tree}/ is empty here"
    assert expected <= dist.sdist_files, sorted(expected - dist.sdist_files)


def test_sdist_carries_the_release_files(dist: Dist) -> None:
    assert {"LICENSE", "CHANGELOG.md", "README.md", "run_tests.sh"} <= dist.sdist_files


def test_wheel_holds_the_package_only(dist: Dist) -> None:
    tops = {name.split("/")[0] for name in dist.wheel_files}
    version = scrapy_redisspine.__version__
    assert tops == {"scrapy_redisspine", f"scrapy_redisspine-{version}.dist-info"}
    assert "scrapy_redisspine/py.typed" in dist.wheel_files
    assert "scrapy_redisspine/scripts/lease.lua" in dist.wheel_files


def test_version_is_single_sourced(dist: Dist) -> None:
    """pyproject.toml declares no version of its own: the build reads ``__version__``."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version\s*=\s*"', pyproject, re.MULTILINE) is None
    assert 'dynamic = ["version"]' in pyproject
    assert dist.metadata["Version"] == scrapy_redisspine.__version__


def test_python_classifiers_follow_requires_python(dist: Dist) -> None:
    """One classifier per 3.x from the minimum ``Requires-Python`` allows, no gaps, and
    the interpreter running the tests among them."""
    minimum = re.fullmatch(r">=3\.(\d+)", dist.metadata["Requires-Python"])
    assert minimum is not None
    minors = sorted(
        int(match.group(1))
        for value in dist.metadata.get_all("Classifier", [])
        if (match := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", value))
    )
    assert minors[0] == int(minimum.group(1))
    assert minors == list(range(minors[0], minors[-1] + 1))
    assert sys.version_info.minor in minors


def test_metadata_a_package_index_shows(dist: Dist) -> None:
    classifiers = set(dist.metadata.get_all("Classifier", []))
    assert {"Framework :: Scrapy", "Development Status :: 4 - Beta"} <= classifiers
    assert dist.metadata["Author"] == "the scrapy-redisspine authors"
    assert "scrapy" in dist.metadata["Keywords"].split(",")
    assert dist.metadata["Description-Content-Type"] == "text/markdown"


def test_readme_has_no_links_a_package_index_breaks() -> None:
    """PyPI shows the README without the repository around it and gives headings no
    anchors: a relative link or a ``#anchor`` would lead nowhere there."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)", readme) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", readme,
                                                                re.MULTILINE)
    broken = [target for target in targets if not target.startswith(("https://", "http://"))]
    assert broken == []


def test_tests_pass_from_the_unpacked_sdist(dist: Dist, tmp_path: Path) -> None:
    """What a downstream packager does: unpack the sdist and run its tests there, on
    the sdist's own package (not this checkout's). A few files that need what an
    sdist most easily lacks: the Lua scripts and their libraries, a real crawl of the
    test project (its scrapy.cfg, settings and spiders), the docs' settings reference."""
    with tarfile.open(dist.sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    probe = subprocess.run(
        [sys.executable, "-c", "import scrapy_redisspine; print(scrapy_redisspine.__file__)"],
        cwd=unpacked, capture_output=True, text=True, check=True,
    )
    assert Path(probe.stdout.strip()).is_relative_to(unpacked), probe.stdout
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/unit/test_scripts.py", "tests/test_docs.py",
         "tests/integration/test_spine_e2e.py::test_three_workers_fetch_every_page_exactly_once"],
        cwd=unpacked, capture_output=True, text=True, check=False, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]
