"""The distribution builds cleanly: the sdist and the wheel come out of the build backend the
project declares, with every warning an error (a deprecation today is a failed `pip install .`
on a later release), and say the license as an SPDX expression."""

from __future__ import annotations

import email.parser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile

from packaging.specifiers import SpecifierSet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = """
import sys
import setuptools.build_meta as backend
print("built", getattr(backend, "build_" + sys.argv[1])(sys.argv[2]))
"""


def _build(kind: str, src, out) -> str:
    """The backend's build_sdist or build_wheel in `src`, every warning an error: the name built."""
    done = subprocess.run([sys.executable, "-W", "error", "-c", BUILD, kind, str(out)], cwd=src, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr[-3000:]
    (name,) = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("built ")]
    return name


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_the_build_backend_is_pinned_to_a_range_that_takes_an_spdx_license():
    project = _pyproject()
    (requirement,) = project["build-system"]["requires"]
    name, _, spec = requirement.partition(">")
    assert name == "setuptools" and project["build-system"]["build-backend"] == "setuptools.build_meta"
    allowed = SpecifierSet(">" + spec)
    assert "77.0.2" not in allowed and "77.0.3" in allowed  # PEP 639 expressions from 77.0.3 on
    assert any(s.operator == "<" for s in allowed), "an upper bound: a future major cannot break the install"
    assert project["project"]["license"] == "MIT"
    # What builds below is a release the range allows (the test extra installs one).
    assert importlib.metadata.version("setuptools") in allowed


def test_sdist_and_wheel_build_with_warnings_as_errors(tmp_path):
    src, out = tmp_path / "src", tmp_path / "dist"
    out.mkdir()
    # A copy: the build writes build/ and *.egg-info beside the sources, which other tests read.
    shutil.copytree(os.path.join(ROOT, "edge"), src / "edge", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "packaging").mkdir()
    for name in ("pyproject.toml", "README.md", "packaging/qledge"):  # the launcher pip installs as `qledge`
        shutil.copy(os.path.join(ROOT, name), src / name)
    sdist_name = _build("sdist", src, out)
    assert sdist_name.endswith(".tar.gz")
    with tarfile.open(out / sdist_name) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
        info = next(m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        pkg_info = email.parser.Parser().parsestr(sdist.extractfile(info).read().decode())  # type: ignore[union-attr]
    assert pkg_info["License-Expression"] == "MIT"
    assert (tmp_path / "unpacked" / sdist_name.removesuffix(".tar.gz") / "packaging" / "qledge").is_file()
    # The wheel is built from the unpacked sdist, as pip and `python -m build` do: the sdist is complete.
    wheel_name = _build("wheel", tmp_path / "unpacked" / sdist_name.removesuffix(".tar.gz"), out)
    assert wheel_name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(out / wheel_name) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(wheel.read(meta).decode())
        assert "edge/web/static/index.html" in wheel.namelist()  # package data is shipped
    assert metadata["License-Expression"] == "MIT" and metadata["License"] is None
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
