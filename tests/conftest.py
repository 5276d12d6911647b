"""Suite-wide hooks: the ``requires_tool`` marker (see ``tests/tools.py``) and the split of the suite
over pytest-xdist workers that never starts a shared real run twice (``tests/xdist_units.py``)."""

from __future__ import annotations

import pytest

from tests.tools import check_tools
from tests.xdist_units import check_units, make_scheduler


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_tool(*names, install=...): needs one of these programs; "
                                       "skipped when missing, failed when CI=true")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires_tool"):
        check_tools(marker)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadscope``, tests that share a real run stay on one worker and the others spread
    one by one (``tests/xdist_units.py``)."""
    return make_scheduler(config, log) if config.getvalue("dist") == "loadscope" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    check_units(items)
