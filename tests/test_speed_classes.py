"""The speed-class check of tests/conftest.py: every test has exactly one of unit, integration
and slow (a module's class, or slow on a longer test of a quicker module), and a test without
one stops the run before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SPEED_CLASSES, speed_class_problem

pytestmark = pytest.mark.integration

# The markers as pyproject.toml declares them, for the small sessions pytester starts.
PYPROJECT = "[tool.pytest.ini_options]\nmarkers = [" + ", ".join(
    f'"{name}: -"' for name in SPEED_CLASSES) + "]\n"

MODULE = """
import pytest

pytestmark = pytest.mark.integration

def test_module_class(): pass

@pytest.mark.slow
def test_slower(): pass

@pytest.mark.unit
def test_faster(): pass

@pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_param(x): pass

class TestGrouped:
    pytestmark = pytest.mark.unit

    def test_in_class(self): pass
"""


def test_module_class_and_slow_overrides_are_accepted_others_named(
        pytester: pytest.Pytester) -> None:
    """One class, or a module's class plus slow, passes; faster than the module, or two
    classes at one level, is named."""
    pytester.makepyprojecttoml(PYPROJECT)
    items = {item.name: speed_class_problem(item) for item in pytester.getitems(MODULE)}
    assert items == {
        "test_module_class": None,
        "test_slower": None,
        "test_faster": "unit inside a integration module: only slow may override",
        "test_param[1]": None,
        "test_param[2]": None,
        "test_in_class": "several speed classes: integration, unit",
    }


# The suite's own hook, loaded by path (the small session has a conftest.py of its own).
TESTS = Path(__file__).resolve().parent
CONFTEST = f"""
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
"""


@pytest.mark.slow
def test_a_test_without_a_class_stops_the_run(pytester: pytest.Pytester) -> None:
    """A module without pytestmark is refused at collection, naming the test; nothing runs."""
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_unmarked="def test_forgotten(): pass\n",
        test_marked="import pytest\npytestmark = pytest.mark.unit\ndef test_fine(): pass\n")
    result = pytester.runpytest_subprocess("-m", "not slow")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*every test needs exactly one speed class*",
        "*no speed class: 1 test(s), e.g. test_unmarked.py::test_forgotten*"])
    assert "passed" not in result.stdout.str()
