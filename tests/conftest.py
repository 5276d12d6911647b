"""Suite-wide hooks: the ``requires_tool`` marker (see ``tests/tools.py``)."""

from __future__ import annotations

import pytest

from tests.tools import check_tools


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_tool(*names, install=...): needs one of these programs; "
                                       "skipped when missing, failed when CI=true")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires_tool"):
        check_tools(marker)
