"""The analysis records share one list of step components: ``measures.COMPONENTS``.

``RankTotals`` (sums), ``RankMetrics`` (their means) and ``StepValues`` (one step) each carry every
component, typed alike (a field, or a property where it is computed from the others), so a component
added to the list and not to a record, or typed otherwise in one of them, fails here.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from traceml_otel.analyze.findings import RankMetrics
from traceml_otel.analyze.measures import COMPONENTS, RankTotals, StepValues


def _component_types(record: type) -> dict[str, str]:
    fields = {f.name: str(f.type) for f in dataclasses.fields(record)}
    types = {}
    for name in COMPONENTS:
        if name in fields:
            types[name] = fields[name]
        else:
            prop = getattr(record, name, None)
            assert isinstance(prop, property), f"{record.__name__} lacks the component {name}"
            types[name] = str(typing.get_type_hints(prop.fget)["return"]).replace("typing.", "").replace(
                "<class 'float'>", "float")
    return types


@pytest.mark.parametrize("record", [RankMetrics, StepValues])
def test_each_record_carries_every_component_typed_as_the_sums(record: type) -> None:
    expected = _component_types(RankTotals)
    got = _component_types(record)
    normalise = {"Optional[float]": "float | None"}
    assert {k: normalise.get(v, v) for k, v in got.items()} == {
        k: normalise.get(v, v) for k, v in expected.items()}
