"""The tools and packages tests need that ``scripts/setup.sh --test`` installs (Debian's prometheus,
promtool and node exporter; the rotel collector; the framework packages).

Where one is missing, a test that needs it is skipped on a developer's machine but FAILS in CI
(``CI=true``), where setup installed it: a broken setup never passes as a quiet row of skips. Mark
a test (or a module, with ``pytestmark``) ``@requires_tool("promtool")``; where the need shows only
at run time, call :func:`missing`. ``tests/conftest.py`` applies the marker.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
APT_PROMETHEUS = "apt-get install prometheus prometheus-node-exporter; or bash scripts/setup.sh --test"
PIP_TEST = "pip install -e '.[test]'; or bash scripts/setup.sh --test"

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def missing(what: str, install: str) -> NoReturn:
    """``what`` is not installed: skip, or fail in CI."""
    message = f"{what} is not installed ({install})"
    if IN_CI:
        pytest.fail(f"{message}: CI's setup installs it, so its tests may not skip", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def requires_tool(*names: str, install: str = APT_PROMETHEUS) -> pytest.MarkDecorator:
    """The test needs one of the programs ``names`` on PATH."""
    return pytest.mark.requires_tool(*names, install=install)


def check_tools(marker: pytest.Mark) -> None:
    """Skip or fail (CI) a test whose ``requires_tool`` marker names no installed program."""
    if not any(shutil.which(name) for name in marker.args):
        missing(" or ".join(marker.args), marker.kwargs.get("install", APT_PROMETHEUS))


def import_or_missing(package: str) -> ModuleType:
    """``importlib.import_module(package)``; skip, or fail in CI, when it is not installed."""
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as error:
        if error.name is not None and package.split(".")[0] != error.name.split(".")[0]:
            raise  # the package is there but broken: an error, never a skip
        missing(package, PIP_TEST)
