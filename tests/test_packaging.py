"""One version and one licence: the package, the command line, the MCP server and the installed
distribution agree on the version written once in fleetclaims/_version.py; the sdist and the
wheel built from this tree carry the LICENSE and declare MIT."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import fleetclaims
from fleetclaims.cli import main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "fleetclaims" / "_version.py"


def _written_version() -> str:
    """The version as _version.py writes it, read as text (not through the import system)."""
    found: list[str] = re.findall(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(),
                                  flags=re.M)
    assert len(found) == 1, found
    return found[0]


def test_one_version_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    """fleetclaims --version, fleetclaims.__version__ and the installed metadata agree."""
    version = _written_version()
    assert fleetclaims.__version__ == version
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"fleetclaims {version}\n"
    # The metadata of the installed (editable) distribution: stale after a version bump until
    # `pip install -e .` runs again, which is the drift this catches.
    assert importlib.metadata.version("fleetclaims") == version


def test_mcp_server_reports_the_package_version(tmp_path: Path) -> None:
    """The MCP server announces fleetclaims.__version__ to its clients."""
    pytest.importorskip("mcp")
    from fleetclaims import Registry
    from fleetclaims.agents.mcp_server import build

    with Registry(tmp_path / "reg") as registry:
        server, _ = build(registry, "agent-a")
        assert server.version == fleetclaims.__version__


def test_the_version_literal_is_written_once() -> None:
    """No other source file or pyproject.toml writes the version string itself."""
    literal = f'"{_written_version()}"'
    sources = [ROOT / "pyproject.toml", *sorted((ROOT / "fleetclaims").rglob("*.py"))]
    writers = [p.relative_to(ROOT).as_posix() for p in sources if literal in p.read_text()]
    assert writers == ["fleetclaims/_version.py"]


# The PEP 517 hooks of the build backend, run in a child in the project root (where they look
# for pyproject.toml), without build isolation so that the test needs no network.
BUILD = """
import json, sys
import hatchling.build as backend
out = sys.argv[1]
print(json.dumps([backend.build_sdist(out), backend.build_wheel(out)]))
"""


@pytest.mark.slow
def test_sdist_and_wheel_carry_the_license(tmp_path: Path) -> None:
    """The sdist and the wheel built from this tree hold LICENSE and declare it with MIT."""
    pytest.importorskip("hatchling.build")
    done = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    sdist_name, wheel_name = json.loads(done.stdout.strip().splitlines()[-1])
    version = _written_version()
    license_text = (ROOT / "LICENSE").read_text()
    assert "MIT License" in license_text

    with tarfile.open(tmp_path / sdist_name) as sdist:
        top = f"fleetclaims-{version}"
        sdist_license = sdist.extractfile(f"{top}/LICENSE")
        sdist_info = sdist.extractfile(f"{top}/PKG-INFO")
        assert sdist_license is not None and sdist_info is not None
        assert sdist_license.read().decode() == license_text
        sdist_meta = Parser().parsestr(sdist_info.read().decode())

    with zipfile.ZipFile(tmp_path / wheel_name) as wheel:
        info = f"fleetclaims-{version}.dist-info"
        assert wheel.read(f"{info}/licenses/LICENSE").decode() == license_text
        wheel_meta = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())

    for meta in (sdist_meta, wheel_meta):
        assert meta["Version"] == version
        assert meta["License-Expression"] == "MIT"
        assert meta.get_all("License-File") == ["LICENSE"]
