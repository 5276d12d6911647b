"""Suite-wide hooks: the ``requires_tool`` marker (see ``tests/tools.py``) and the grouping that keeps
pytest-xdist from running a shared real run twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools import check_tools

TESTS = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_tool(*names, install=...): needs one of these programs; "
                                       "skipped when missing, failed when CI=true")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires_tool"):
        check_tools(marker)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` every test that uses a module- or class-scoped fixture of this suite
    (one real run shared by its tests) goes to one worker with the rest of its module, and the users of
    a session-scoped one to one worker together, so that no real run is started twice; a test that
    already has an ``xdist_group`` mark keeps it. Other tests are spread one by one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = _shared_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _shared_fixture_group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    scopes = {definition.scope: definition for definitions in info.name2fixturedefs.values()
              for definition in definitions if _is_ours(definition)}
    if "session" in scopes:
        return f"session-fixture:{scopes['session'].argname}"
    if scopes.keys() & {"package", "module", "class"}:
        return item.nodeid.split("::")[0]
    return None


def _is_ours(definition: pytest.FixtureDef[object]) -> bool:
    """Defined in this suite (not pytest's or a plugin's own fixtures, e.g. ``tmp_path_factory``,
    whose ``baseid`` is empty)."""
    return bool(definition.baseid)
