"""Every model's compute is compute: a GAN traced with trace_step(G) times D's three forwards per
step as forward (one mechanism with zero-code discovery), and reads COMPUTE_BOUND in both modes. The
step's forward spans name their model (``traceml.module.class``): one Generator, three
Discriminator; a single-model step's do not carry the attribute (tests/verdicts/test_recomputation.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.local_copy_reader import read_run
from tests.verdicts.runner import traceml_run


def forward_calls_per_step(run_dir: Path) -> Counter[int]:
    """How many steps had each number of forward spans."""
    spans = read_run(run_dir)
    steps = {s.span_id for s in spans if s.name == "traceml.step"}
    per_step = Counter(s.parent_span_id for s in spans if s.name == "traceml.forward")
    return Counter(per_step.get(step, 0) for step in steps)


@pytest.mark.parametrize("mode", ["explicit", "zero-code"])
def test_gan_traced_with_its_generator_is_compute_bound(tmp_path: Path, mode: str) -> None:
    run = traceml_run(tmp_path, "gan.py", "--steps", "60", *(("--explicit",) if mode == "explicit" else ()))
    primary = run.report["primary_diagnosis"]
    assert primary["kind"] == "COMPUTE_BOUND", primary
    residual = run.share("residual")
    assert residual is not None and residual < 0.10, residual
    forward = run.share("forward")
    assert forward is not None and forward > 0.25, forward  # D's forwards are in it (it is ~3/4 of them)
    counts = forward_calls_per_step(run.run_dir)
    # G once and D three times: four outermost forwards per step, once the models are known
    assert counts.most_common(1)[0][0] == 4, counts
    assert sum(n for calls, n in counts.items() if calls > 4) == 0, counts  # nothing counted twice
    # each forward span names its model, once the second model is known (from the first step on)
    spans = read_run(run.run_dir)
    step_ids = {s.span_id: s.attributes["traceml.step.number"] for s in spans if s.name == "traceml.step"}
    models: dict[int, Counter[str | None]] = {}
    for span in spans:
        if span.name == "traceml.forward":
            models.setdefault(step_ids[span.parent_span_id], Counter())[
                span.attributes.get("traceml.module.class")] += 1
    named = [models[n] for n in sorted(models) if n >= 1]
    assert named and all(m == {"Generator": 1, "Discriminator": 3} for m in named), named
    total = sum(run.share(name) or 0.0 for name in ("input_wait", "forward", "backward", "optimizer",
                                                     "residual"))
    assert total <= 1.0 + 1e-6
