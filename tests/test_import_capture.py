"""Capture never imports emit: the two meet only in ``traceml_otel.wire`` and ``records``.

``tests/test_import_direction.py`` checks that ``wire`` itself imports neither.
"""

from __future__ import annotations

import json
import subprocess
import sys

IMPORT_ALL = """
import importlib, json, pkgutil, sys
import traceml_otel.{package} as package
for module in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f"{{package.__name__}}.{{module.name}}")
print(json.dumps(sorted(name for name in sys.modules if name.startswith("traceml_otel."))))
"""


def _imported_by(package: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL.format(package=package)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_importing_every_capture_module_does_not_import_emit() -> None:
    imported = _imported_by("capture")
    assert "traceml_otel.capture.recorder" in imported and "traceml_otel.wire.step_row" in imported
    assert [name for name in imported if name.startswith("traceml_otel.emit")] == []
