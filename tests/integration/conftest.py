"""The live stack scenarios that mostly wait on the clock run side by side.

``test_stack_lifecycle_live.py`` (an HA pair, a failed job, a restart) and ``test_stack_live.py``
(drift, a killed input-bound run, the dashboard) each drive real trainers and their own Prometheus
through a scenario of a minute or more, most of it waiting for alerts to go pending, fire and
resolve. The first of the two modules to need its scenario starts both (those of the two that the
session collected), each in a thread, in that order: the second starts once the first says it has
settled (its trainers started and its restart is live), so that the two never start their trainers
and Prometheus servers at the same time on a small machine. Each module waits for its own scenario
and stops it after its tests. The CPU-bound DDP job of ``test_stack_communication_live.py`` is not
one of them. Under pytest-xdist the two modules are one unit of work (``tests/xdist_units.py``'s
JOINED): one worker runs both scenarios, while the other worker runs other tests beside them.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = {
    "tests.integration.test_stack_lifecycle_live": "lifecycle_scenario",
    "tests.integration.test_stack_live": "live_scenario",
}
"""Module -> its scenario, in starting order: a generator function of a scratch folder and an event
to set once its start-up is over, that yields what its tests read."""
SCENARIO_TIMEOUT_S = 600


class _Scenario:
    """One scenario's generator, advanced to its yield in a thread (after ``after`` is set)."""

    def __init__(self, make: Callable[[Path, threading.Event], Iterator[Any]], folder: Path,
                 after: threading.Event | None) -> None:
        self.settled = threading.Event()
        self._steps = make(folder, self.settled)
        self._after = after
        self._value: Any = None
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._advance, name=f"scenario {make.__name__}", daemon=True)
        self._thread.start()

    def _advance(self) -> None:
        if self._after is not None:
            self._after.wait(SCENARIO_TIMEOUT_S)
        try:
            self._value = next(self._steps)
        except BaseException as error:  # pytest.fail's Failed too: raised again in the test's thread
            self._error = error
        finally:
            self.settled.set()

    def result(self) -> Any:
        self._thread.join(SCENARIO_TIMEOUT_S)
        if self._thread.is_alive():
            pytest.fail(f"{self._thread.name} did not finish within {SCENARIO_TIMEOUT_S} s")
        if self._error is not None:
            raise self._error
        return self._value

    def close(self) -> None:
        """Stop its processes (the generator's ``finally``); once."""
        if self._closed:
            return
        self._closed = True
        self._thread.join(SCENARIO_TIMEOUT_S)
        if not self._thread.is_alive():
            self._steps.close()


class SideBySide:
    """The scenarios of the collected live modules, started together."""

    def __init__(self, scenarios: dict[str, _Scenario]) -> None:
        self._scenarios = scenarios

    def result(self, module: str) -> Any:
        """What ``module``'s scenario yielded, once it got there (its error, raised, otherwise)."""
        return self._scenarios[module].result()

    def close(self, module: str) -> None:
        self._scenarios[module].close()

    def close_all(self) -> None:
        for scenario in self._scenarios.values():
            scenario.close()


@pytest.fixture(scope="session")
def side_by_side(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[SideBySide]:
    collected = {item.module.__name__ for item in request.session.items if isinstance(item, pytest.Function)}
    scenarios: dict[str, _Scenario] = {}
    previous: _Scenario | None = None
    for module, name in SCENARIOS.items():
        if module in collected:
            make = getattr(importlib.import_module(module), name)
            scenarios[module] = previous = _Scenario(make, tmp_path_factory.mktemp(name),
                                                     None if previous is None else previous.settled)
    group = SideBySide(scenarios)
    yield group
    group.close_all()
