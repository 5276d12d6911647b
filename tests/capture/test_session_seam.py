"""The training session is the one seam: its interface is complete, and nobody reaches past it.

- every public method of :class:`TrainingSession` is declared (as a no-op) on :class:`Session`, so a
  caller typed against the interface never needs a ``type: ignore`` or a ``getattr`` guess;
- no module of the package but the facade and the composition root imports ``_api``, and no
  module reads a private name of another module of ours (``module._name``), the seam's old leaks
  (``_api._telemetry``, ``_api._init_config``, ``hooks._pre``, ``backward._timed``) included.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from traceml_otel.capture.session import NOOP, Session, TrainingSession, current

PACKAGE = Path(__file__).resolve().parents[2] / "traceml_otel"


def test_every_public_method_of_the_training_session_is_on_the_interface() -> None:
    public = {name for name, value in vars(TrainingSession).items()
              if callable(value) and not name.startswith("_")}
    missing = sorted(name for name in public if not hasattr(Session, name))
    assert missing == [], missing
    assert public >= {"begin_step", "end_step", "shutdown", "timed_forward", "timed_backward",
                      "time_optimizer_class", "watch_model", "watch_optimizer", "start_inference"}
    for name in public:  # same parameters: a caller of the interface works with either
        assert (list(inspect.signature(getattr(Session, name)).parameters)
                == list(inspect.signature(getattr(TrainingSession, name)).parameters)), name


def test_the_no_op_session_answers_every_call_without_telemetry() -> None:
    assert current() is NOOP and not NOOP.active
    assert NOOP.begin_step(None) is False
    call = lambda: 1  # noqa: E731
    assert NOOP.timed_forward(call) is call and NOOP.timed_backward(call) is call
    assert NOOP.time_optimizer_class(object) is None and NOOP.start_inference() is None
    NOOP.end_step(None)
    NOOP.watch_model(object())
    NOOP.shutdown("ok")


def _private_reads(path: Path) -> list[str]:
    """``alias._name`` where ``alias`` is a module of ours imported in ``path``."""
    tree = ast.parse(path.read_text())
    ours: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("traceml_otel"):
            ours.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            ours.update((alias.asname or alias.name).split(".")[0] for alias in node.names
                        if alias.name.startswith("traceml_otel"))
    return [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ours
        and node.attr.startswith("_") and not node.attr.startswith("__")
    ]


@pytest.mark.parametrize("folder", ["integrations", "capture", "launch"])
def test_no_module_reads_a_private_name_of_another(folder: str) -> None:
    found = [hit for path in sorted((PACKAGE / folder).rglob("*.py")) for hit in _private_reads(path)]
    assert found == []


def test_only_the_package_entry_imports_the_facade_module() -> None:
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if "traceml_otel._api" in names:
                importers.append(str(path.relative_to(PACKAGE)))
    # The framework driver calls the public API too: it imports the facade module itself rather than
    # the package root (an import back up a layer, test_import_direction.py).
    assert set(importers) == {"__init__.py", "integrations/_driver.py"}, importers
