"""``os._exit()`` skips ``atexit``: the session still ends first, so no step is lost.

Scripts call it to skip a teardown that hangs. A fast loop never reaches the 256-step or 250 ms
hand-off, so before this every step was lost. The script here also runs a DataLoader with forked
workers, whose own ``os._exit`` at their end must not touch the parent's session.
"""

from __future__ import annotations

from pathlib import Path

from tests.capture.test_work_capture import _python
from tests.local_copy_reader import read_run
from traceml_otel import contract as c
from traceml_otel.wire.export_stats import read_export_stats_file


def test_os_exit_hands_over_every_step_and_records_its_code(tmp_path: Path) -> None:
    result = _python("""
        import os
        import torch
        import traceml_otel as traceml
        traceml.init()
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)  # forked workers exit too
        model = torch.nn.Linear(4, 1)
        for (x,) in loader:
            with traceml.trace_step(model):
                model(x).sum().backward()
        for _ in range(92):
            with traceml.trace_step(model):
                model(torch.ones(8, 4)).sum().backward()
        print("trained", flush=True)
        os._exit(3)
    """, tmp_path)
    assert result.returncode == 3, result.stderr
    assert "trained" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    steps = [s for s in read_run(run_dir) if s.name == c.SPAN_STEP]
    assert sorted(s.attributes[c.ATTR_STEP] for s in steps) == list(range(100))
    stats = read_export_stats_file(run_dir / "rank-0.export.json")
    assert stats.clean_shutdown and stats.end_status == "os._exit(3)"
