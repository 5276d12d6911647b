"""How pytest-xdist splits the suite (``-n 2 --dist loadscope``, see pyproject.toml's addopts).

A module whose tests share one real run (a module-, class-, package- or session-scoped fixture: a
live launch, a Prometheus, a set of hang jobs) is one unit of work, so that only one worker starts
that run; the modules of :data:`JOINED` are one unit together (they share a session-scoped fixture);
every other test is a unit of its own, so that the slow independent launches spread over the workers.
The units with the most tests are handed out first (xdist's ``--loadscope-reorder``).

pytest-xdist's own ``--dist loadgroup`` would do this with ``xdist_group`` marks, but it renames the
node id to carry the group, which pytest 9.2's structured node ids ignore (every test became a unit
of its own and each module's shared run was started on both workers), so the scheduler decides here,
from the node ids and the modules' source; :func:`check_units` fails the session if the two disagree.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

_LIVE = "live stack scenarios (tests/integration/conftest.py)"
JOINED = {
    "tests/integration/test_stack_lifecycle_live.py": _LIVE,
    "tests/integration/test_stack_live.py": _LIVE,
}
"""Modules that run side by side from one session-scoped fixture: one worker for all of them."""

_WIDE_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*scope\s*=\s*["'](module|class|package|session)["']""")


def unit_of(nodeid: str) -> str:
    """The unit of work that the test ``nodeid`` belongs to."""
    module = nodeid.split("::", 1)[0]
    if module in JOINED:
        return JOINED[module]
    return module if shares_a_run(module) else nodeid


@cache
def shares_a_run(module: str) -> bool:
    """Whether the test module ``module`` (a path from the repository root) defines a fixture wider
    than one test."""
    try:
        source = (ROOT / module).read_text(encoding="utf-8")
    except OSError:
        return False
    return _WIDE_FIXTURE.search(source) is not None


def check_units(items: Sequence[pytest.Item]) -> None:
    """Fail the session if a test that uses one of this suite's fixtures wider than a test is a unit
    of its own, or the users of a session-scoped one are in more than one unit: xdist would start
    that run more than once."""
    units_of_session_fixture: dict[str, set[str]] = defaultdict(set)
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        wide = {d.argname: d.scope for defs in info.name2fixturedefs.values() for d in defs
                if d.baseid and d.scope != "function"}  # baseid "": pytest's or a plugin's own
        unit = unit_of(item.nodeid)
        if wide and unit == item.nodeid:
            raise pytest.UsageError(f"{item.nodeid} uses {sorted(wide)}, but tests/xdist_units.py makes it a "
                                    "unit of its own: add its module to JOINED")
        for name, scope in wide.items():
            if scope == "session":
                units_of_session_fixture[name].add(unit)
    for name, units in units_of_session_fixture.items():
        if len(units) > 1:
            raise pytest.UsageError(f"the session fixture {name} is used from {sorted(units)}: "
                                    "join them in tests/xdist_units.py's JOINED")


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's ``loadscope`` scheduler with :func:`unit_of` as its scope."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return SharedRunScheduling(config, log)
