"""Inferred steps against ``trace_step`` on the same loops: does inference shift step durations? (CPU)

    .venv/bin/python benchmarks/inferred_steps_match.py [--pairs 6] [--updates 12] [--sleep-ms 0]
        [--width 4096]

Runs ``tests/zero_code/scripts/loop_cases.py`` (evaluation inside the loop, gradient accumulation
from a generator, two optimizers, Accelerate with accumulation) as an unmodified script whose steps
are inferred (``TRACEML_AUTO=1``) and as the same loops in ``trace_step`` blocks, one after the
other, ``--pairs`` times (interleaved: a burst of load hits both versions alike). Each run's local copy
is read back. Per case it prints the median step duration of each version (median over a run's steps,
then over runs), the ratio inferred / trace_step (median over the pairs, and its range), and the
median time inside a step outside its phase spans for each version (where a misplaced step boundary
would show). ``--sleep-ms`` makes each forward sleep (the test uses 150 ms: load-proof steps);
``--width`` sizes the MLP (0 ms sleep and width 4096: CPU-bound steps of a few ms).

Last, a count that load cannot blur: the Python function calls per training iteration (cProfile,
after inference's warm-up) of a bare iteration, the same in a ``trace_step`` block, and with its step
inferred: what inference itself adds to each step on the training thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the local-copy reader lives in tests/

from tests.zero_code.runner import read_run  # noqa: E402

SCRIPT = REPO / "tests" / "zero_code" / "scripts" / "loop_cases.py"
CASES = ("eval", "accumulation", "two_optimizers", "accelerate")


def one_run(folder: Path, version: str, args: argparse.Namespace) -> dict[str, tuple[list, list]]:
    """(step durations, time outside phases) in ms per case, for one run of ``version``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "OTEL_", "PYTHONPATH"))}
    env.update(TRACEML_AUTO="1", TRACEML_RUNS_DIR=str(folder / "runs"), WINDOWS_DIR=str(folder),
               LOOP_UPDATES=str(args.updates), LOOP_SLEEP_MS=str(args.sleep_ms), LOOP_WIDTH=str(args.width))
    subprocess.run([sys.executable, str(SCRIPT), version], env=env, cwd=folder, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    (run_dir,) = (folder / "runs").iterdir()
    rank = read_run(run_dir, 1)[0]
    windows = json.loads((folder / f"cases-{version}.json").read_text())
    found = {}
    for name, start, end in windows:
        steps = [s for s in rank.steps if start <= s.start_ns and s.end_ns <= end]
        durations = [(s.end_ns - s.start_ns) / 1e6 for s in steps]
        outside = [d - sum(c.end_ns - c.start_ns for c in rank.children.get(s.span_id, [])) / 1e6
                   for d, s in zip(durations, steps, strict=True)]
        found[name] = (durations, outside)
    return found


def calls_per_iteration(iterations: int = 200) -> dict[str, float]:
    """Python calls per iteration: bare, in a trace_step block, inferred (the recorder's own pieces)."""
    import cProfile
    import pstats
    from types import SimpleNamespace

    import torch
    from torch import nn

    from traceml_otel.capture import hooks
    from traceml_otel.capture.inferred_steps import WARM_UP_STEPS, InferredSteps
    from traceml_otel.capture.recorder import StepRecorder

    class Discard:
        def send_steps(self, rows: list) -> None:
            pass

    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    counts = {}
    for mode in ("bare", "trace_step", "inferred"):
        recorder = StepRecorder(Discard(), flush_steps=64)
        forward = hooks.ForwardHooks(recorder)
        backward, optimizer_hooks = hooks.BackwardPatch(recorder), hooks.OptimizerHooks(recorder)
        if mode != "bare":
            backward.install()
            optimizer_hooks.install()
            forward.watch(model)
        session = SimpleNamespace(recorder=recorder, forward=forward, optimizer_hooks=optimizer_hooks,
                                  config=SimpleNamespace(optimizer=True), inferred=None,
                                  model_seen=forward.watch)
        inferred = InferredSteps(session)  # type: ignore[arg-type]
        step = iteration
        if mode == "inferred":
            inferred.start()
        elif mode == "trace_step":
            def step(recorder: StepRecorder = recorder) -> None:
                recorder.begin_step()
                iteration()
                recorder.end_step()
        for _ in range(WARM_UP_STEPS + 2):
            step()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(iterations):
            step()
        profile.disable()
        counts[mode] = pstats.Stats(profile).total_calls / iterations  # type: ignore[attr-defined]
        inferred.stop()
        optimizer_hooks.uninstall()
        backward.uninstall()
        forward.uninstall()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=4096)
    args = parser.parse_args()
    medians: dict[tuple[str, str], list[float]] = {}
    outside: dict[tuple[str, str], list[float]] = {}
    ratios: dict[str, list[float]] = {case: [] for case in CASES}
    counts: dict[tuple[str, str], set[int]] = {}
    with tempfile.TemporaryDirectory() as base:
        for pair in range(args.pairs):
            order = ("inferred", "trace_step") if pair % 2 == 0 else ("trace_step", "inferred")
            runs = {}
            for version in order:
                folder = Path(base, f"{pair}-{version}")
                folder.mkdir()
                runs[version] = one_run(folder, version, args)
            for case in CASES:
                for version, found in runs.items():
                    durations, gaps = found[case]
                    medians.setdefault((case, version), []).append(statistics.median(durations))
                    outside.setdefault((case, version), []).append(statistics.median(gaps))
                    counts.setdefault((case, version), set()).add(len(durations))
                ratios[case].append(statistics.median(runs["inferred"][case][0])
                                    / statistics.median(runs["trace_step"][case][0]))
    print(f"{args.pairs} interleaved pairs, {args.updates} updates per case, "
          f"forward sleep {args.sleep_ms:g} ms, width {args.width}")
    print(f"{'case':<15} {'steps':>9} {'trace_step ms':>14} {'inferred ms':>12} {'ratio (range)':>22} "
          f"{'outside phases ms: trace_step / inferred':>42}")
    for case in CASES:
        traced, inferred = (statistics.median(medians[(case, v)]) for v in ("trace_step", "inferred"))
        ratio = ratios[case]
        steps = f"{sorted(counts[(case, 'trace_step')])}/{sorted(counts[(case, 'inferred')])}"
        out_t, out_i = (statistics.median(outside[(case, v)]) for v in ("trace_step", "inferred"))
        print(f"{case:<15} {steps:>9} {traced:14.2f} {inferred:12.2f} "
              f"{statistics.median(ratio):8.3f} ({min(ratio):.3f}-{max(ratio):.3f}) "
              f"{out_t:20.3f} / {out_i:.3f}")
    counts = calls_per_iteration()
    added = counts["inferred"] - counts["trace_step"]
    print(f"python calls per iteration: bare {counts['bare']:.0f}, trace_step {counts['trace_step']:.0f}, "
          f"inferred {counts['inferred']:.0f} (inference adds {added:+.0f})")


if __name__ == "__main__":
    main()
