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


# --- the whole package's import graph: no circles, and one order of layers ---------------------------
#
# The graph: one node per module of the package (``pkg/__init__.py`` is ``pkg``), one edge per import
# that can run, at module level or inside a function (a lazy import is still a dependency). Imports
# under ``if TYPE_CHECKING:`` never run and are left out: they name types, and a circle of them is
# harmless. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``.

LAYERS: tuple[tuple[str, ...], ...] = (
    # 0-2. leaves and names: nothing here knows about capture, export or analysis
    ("_version", "_first_seen", "errors", "warn_line", "sanitize", "contract", "step_records"),
    ("env_values", "otlp_choice"),
    ("run_identity",),
    # 3. the configuration, and the records that cross process and file boundaries
    ("settings", "wire"),
    # 4. the training side's capture; the analyzer; the stack's config renderer (none imports another)
    ("capture", "analyze", "stack"),
    # 5. the emitter process (it runs the analyzer for the live summary)
    ("emit",),
    # 6. the reports
    ("report",),
    # 7. the launcher, run folder and live view
    ("launch",),
    # 8. the composition root (the one place that knows capture, emit and launch), then the training API
    ("session_root",),
    ("_api",),
    # 10. what sits on the public API: the framework integrations (and zero-code start-up), the package
    #     root (it loads ``_api`` on first use)
    ("integrations", ""),
    # 11. entry points nothing in the package imports: the command line, and the ``sitecustomize`` that
    #     ``traceml run`` puts on its children's path
    ("cli", "launch._boot"),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that an import in ``path`` can load (not those under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    named: list[str] = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            named += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            named += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = set()
    for name in named:
        while name and name not in modules:  # an attribute of a module: the module
            name = name.rpartition(".")[0]
        if name and name != me:
            found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    return {_module_name(path): _runtime_imports(path, modules) for path in paths}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _unit(module: str) -> tuple[int, str]:
    """(layer, unit) of a module: the longest unit in :data:`LAYERS` that names it or a package above it."""
    relative = module.removeprefix("traceml_otel").removeprefix(".")
    best: tuple[int, str] | None = None
    for layer, units in enumerate(LAYERS):
        for unit in units:
            if (relative == unit or relative.startswith(unit + ".") or (unit == "" and relative == "")) and (
                best is None or len(unit) > len(best[1])
            ):
                best = (layer, unit)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS"
    return best


def test_the_graph_sees_function_level_imports_and_skips_type_only_ones(tmp_path: Path) -> None:
    modules = {"traceml_otel.a", "traceml_otel.b", "traceml_otel.c", "traceml_otel.d"}
    source = PACKAGE / "_probe_graph.py"
    assert not source.exists()
    try:
        source.write_text(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from traceml_otel import a\n"
            "def f():\n    from traceml_otel.b import thing\n    import traceml_otel.c\n",
            encoding="utf-8",
        )
        assert _runtime_imports(source, modules) == {"traceml_otel.b", "traceml_otel.c"}
    finally:
        source.unlink()
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_two_modules_import_each_other_even_through_others() -> None:
    graph = _graph()
    assert len(graph) > 150  # the whole package was read
    assert _circles(graph) == []


def test_every_import_goes_to_its_own_unit_or_a_lower_layer() -> None:
    wrong = []
    for module, imported in sorted(_graph().items()):
        layer, unit = _unit(module)
        for other in sorted(imported):
            other_layer, other_unit = _unit(other)
            if other_unit != unit and other_layer >= layer:
                wrong.append(f"{module} (layer {layer}) imports {other} (layer {other_layer})")
    assert wrong == []
