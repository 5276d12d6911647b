"""One training thread per process (issue 21): ``trace_step`` blocks and phases of a second thread are
ignored with one counted warning, never merged into the first thread's steps; and ``init()``'s
"what differs" text names every setting, ``collectives`` included."""

from __future__ import annotations

from pathlib import Path

from tests.capture.test_work_capture import _python
from tests.local_copy_reader import read_run
from traceml_otel import contract as c


def test_a_second_threads_steps_are_counted_not_merged(tmp_path: Path) -> None:
    result = _python("""
        import threading
        import torch
        import traceml_otel as traceml
        traceml.init()
        torch.set_num_threads(1)
        started = threading.Event()

        def train(name, steps):
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for step in range(steps):
                with traceml.trace_step(model):
                    started.set()
                    optimizer.zero_grad()
                    model(torch.zeros(2, 4)).sum().backward()
                    optimizer.step()

        first = threading.Thread(target=train, args=("first", 120), name="trainer-1")
        first.start()
        started.wait()
        second = threading.Thread(target=train, args=("second", 120), name="trainer-2")
        second.start()
        first.join()
        second.join()
        try:
            traceml.init(collectives=False)
        except RuntimeError as error:
            print("ERROR", error)
        traceml.shutdown()
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("was called on a second thread (trainer-2)") == 1, result.stderr
    assert "120 trace_step() block(s) and " in result.stderr  # the exit summary counts what was ignored
    assert "blocks are nested" not in result.stderr
    assert "ERROR traceml.init() was already called with a different configuration: collectives: True " \
           "then False" in result.stdout, result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    spans = read_run(run_dir)
    steps = [s for s in spans if s.name == c.SPAN_STEP]
    assert sorted(s.attributes[c.ATTR_STEP] for s in steps) == list(range(120))
    per_step: dict[str, int] = {}
    for span in spans:
        if span.name != c.SPAN_STEP:
            per_step[span.name] = per_step.get(span.name, 0) + 1
    # each of the first thread's steps has one forward, one backward, one optimizer call: none merged in
    assert per_step[c.PHASE_SPAN_NAMES["optimizer"]] == 120, per_step
    assert per_step[c.PHASE_SPAN_NAMES["forward"]] == 120, per_step
    assert {s.attributes.get(c.ATTR_OPTIMIZER_STEPS) for s in steps} == {1}
