"""One direction of imports: cli -> report -> analyze; the libraries never import the layers above them.

Two checks per library, both able to fail:
- a fresh interpreter imports it and reports every module that came with it. The package's own
  ``__init__`` is bypassed there (the plain-import test below covers it), so the check sees only
  what the library itself pulls in: ``traceml_otel`` modules by prefix, and anything outside the
  standard library (``analyze`` and ``report`` must work in the analysis-only install);
- every ``import`` statement in its source, including those inside functions (lazy imports that the
  first check cannot see).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "traceml_otel"

# library -> the traceml_otel modules it may import (prefixes); everything else of ours is forbidden.
ALLOWED = {
    "analyze": (
        "traceml_otel.analyze", "traceml_otel.contract", "traceml_otel.sanitize", "traceml_otel.wire",
        "traceml_otel.errors",
    ),
    "report": (
        "traceml_otel.report", "traceml_otel.analyze", "traceml_otel.contract", "traceml_otel.sanitize",
        "traceml_otel.wire", "traceml_otel.errors",
    ),
    "wire": (
        "traceml_otel.wire", "traceml_otel.contract", "traceml_otel.sanitize", "traceml_otel.step_records",
        "traceml_otel.errors",
    ),
}

_PROBE = """
import json, sys, types
package = types.ModuleType("traceml_otel")
package.__path__ = [sys.argv[1]]
sys.modules["traceml_otel"] = package
before = set(sys.modules)
import importlib, pkgutil
library = importlib.import_module("traceml_otel." + sys.argv[2])
for info in pkgutil.walk_packages(library.__path__, library.__name__ + "."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _library_present(library: str) -> None:
    assert (PACKAGE / library / "__init__.py").is_file(), f"traceml_otel.{library} is gone: update ALLOWED"


def _imported_modules(library: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(PACKAGE), library],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _ours_forbidden(module: str, library: str) -> bool:
    # the bare package counts as ours: ``import traceml_otel`` loads the training API
    ours = module == "traceml_otel" or module.startswith("traceml_otel.")
    return ours and not any(
        module == allowed or module.startswith(allowed + ".") for allowed in ALLOWED[library]
    )


@pytest.mark.parametrize("library", sorted(ALLOWED))
def test_importing_the_library_loads_no_layer_above_it_and_no_third_party_package(library: str) -> None:
    _library_present(library)
    modules = _imported_modules(library)
    assert f"traceml_otel.{library}" in modules
    assert [m for m in modules if _ours_forbidden(m, library)] == []
    third_party = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"traceml_otel"}
    assert third_party == set()


def _import_statements(path: Path) -> list[tuple[int, str]]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names, with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "traceml_otel":  # from traceml_otel import x: the module x
                found += [(node.lineno, f"traceml_otel.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("library", sorted(ALLOWED))
def test_no_import_statement_in_the_library_names_a_layer_above_it(library: str) -> None:
    _library_present(library)
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in sorted((PACKAGE / library).rglob("*.py"))
        for line, module in _import_statements(path)
        if _ours_forbidden(module, library)
    ]
    assert wrong == []


def test_nothing_outside_the_cli_imports_it() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "cli" not in path.relative_to(PACKAGE).parts[:1]
        for line, module in _import_statements(path)
        if module == "traceml_otel.cli" or module.startswith("traceml_otel.cli.")
    ]
    assert wrong == []


def test_the_plain_import_of_the_analyzer_loads_no_layer_above_it_and_no_training_code() -> None:
    """The literal user form, package ``__init__`` included (it loads the training API lazily)."""
    probe = ("import sys, traceml_otel.analyze; "
             "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
             "[['traceml_otel', layer] for layer in "
             "('report', 'cli', 'launch', 'capture', 'emit', '_api', 'session_root', 'integrations')]))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            check=False, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
