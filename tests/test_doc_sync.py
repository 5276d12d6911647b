"""The docs that users read must name exactly what the code reads and writes.

- README.md's settings tables against the environment variables ``settings.py`` reads.
- docs/telemetry.md against the span, attribute and metric names in ``contract.py``.

Each check runs both ways, so a name added on one side only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from traceml_otel import contract, settings

REPO = Path(__file__).resolve().parents[1]
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_SIGNAL_FORM = re.compile(r"_(TRACES|METRICS)_")


def _backticked(text: str) -> set[str]:
    return set(_BACKTICKED.findall(text))


def settings_variables(prefix: str) -> set[str]:
    """The environment variables ``settings.py`` names, as its module constants."""
    return {
        value for name, value in vars(settings).items()
        if name.isupper() and isinstance(value, str) and value.startswith(prefix) and value == name
    }


def readme_variables(prefix: str) -> set[str]:
    """Variables with ``prefix`` that README.md names in backticks (tables and text)."""
    readme = (REPO / "README.md").read_text()
    pattern = re.compile(rf"\b{prefix}[A-Z0-9_]*[A-Z0-9]")
    return {name for token in _backticked(readme) for name in pattern.findall(token)}


def contract_names() -> set[str]:
    """Every span, attribute and metric name in ``contract.py``."""
    names = {
        value for name, value in vars(contract).items()
        if name.startswith(("SPAN_", "ATTR_", "METRIC_")) and isinstance(value, str)
    }
    return names | set(contract.PHASE_SPAN_NAMES.values())


def telemetry_doc_names() -> set[str]:
    """Every ``traceml.*`` name that docs/telemetry.md writes in backticks."""
    doc = (REPO / "docs" / "telemetry.md").read_text()
    return {token for token in _backticked(doc) if re.fullmatch(r"traceml\.[a-z0-9_.]+", token)}


def test_readme_lists_every_traceml_setting_and_no_other() -> None:
    in_code = settings_variables("TRACEML_")
    in_readme = readme_variables("TRACEML_")
    assert in_code - in_readme == set(), "settings.py reads these, README.md does not document them"
    assert in_readme - in_code == set(), "README.md documents these, settings.py does not read them"


def test_readme_covers_every_otel_variable_settings_reads() -> None:
    in_readme = readme_variables("OTEL_")
    undocumented = {
        name for name in settings_variables("OTEL_")
        if name not in in_readme and _SIGNAL_FORM.sub("_", name) not in in_readme
    }
    assert undocumented == set(), "settings.py reads these OTEL_ variables, README.md does not say so"


def test_telemetry_doc_and_contract_name_the_same_things() -> None:
    in_code = contract_names()
    in_doc = telemetry_doc_names()
    assert {n for n in in_code if n.startswith("traceml.")} - in_doc == set(), (
        "contract.py has these names, docs/telemetry.md does not document them"
    )
    assert in_doc - in_code == set(), "docs/telemetry.md documents these names, contract.py lacks them"
    assert contract.ATTR_EXCEPTION_TYPE in _backticked((REPO / "docs" / "telemetry.md").read_text())


def test_telemetry_doc_states_the_contract_version() -> None:
    title = (REPO / "docs" / "telemetry.md").read_text().splitlines()[0]
    assert f"(version {contract.CONTRACT_VERSION})" in title


def test_telemetry_doc_lists_each_step_field_in_its_section_with_its_type_and_unit() -> None:
    """Reads the step schema (``wire/step_schema.py``): each field's attribute is a row of its section's
    table in docs/telemetry.md, typed ``double`` in seconds when the schema scales it to seconds."""
    from traceml_otel.wire.step_schema import NS, STEP_FIELDS

    doc = (REPO / "docs" / "telemetry.md").read_text()
    for field in STEP_FIELDS:
        if field.attribute is None:
            continue
        section = doc.split(f"### {field.doc_section}\n", 1)[1].split("\n#", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith(f"| `{field.attribute}` |")]
        assert len(rows) == 1, (field.name, field.doc_section)
        kind, unit = (cell.strip() for cell in rows[0].split("|")[2:4])
        expected = "double" if field.scale == NS else {int: "int", str: "string"}[field.kind]
        assert (kind, unit == "s") == (expected, field.scale == NS), (field.name, kind, unit)
