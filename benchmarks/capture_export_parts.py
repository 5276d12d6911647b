"""Where a deep capture's export time goes, and what each part costs a training thread beside it.

    .venv/bin/python benchmarks/capture_export_parts.py                 # 64-wide MLP, stacks on
    .venv/bin/python benchmarks/capture_export_parts.py --width 512 --no-stack

A training thread runs small steps (torch on 1 thread); ``torch.profiler`` captures 3 of them as a
deep capture does, then a second thread (nice +10, as the exporter) runs the export's parts one after
the other while the training thread keeps stepping: the profiler parsing its events (``events()``), our
summary (``key_averages()`` and the tree walk), ``export_chrome_trace`` and the gzip. Per part: its
wall time, the steps that overlapped it and the time those steps took over the median step (what the
training lost to it). The numbers back ``docs/captures.md``'s cost budget.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--no-stack", action="store_true")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from traceml_otel.capture.capture_summary import summarize

    torch.set_num_threads(1)
    stack = not args.no_stack
    width = args.width
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, width), torch.randint(0, 8, (16,))
    steps: list[tuple[float, float]] = []

    def step() -> None:
        began = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        steps.append((began, time.perf_counter()))

    for _ in range(300):
        step()
    profiler = profile(activities=[ProfilerActivity.CPU], with_stack=stack)
    began = time.perf_counter()
    profiler.start()
    start_s = time.perf_counter() - began
    for _ in range(3):
        step()
    began = time.perf_counter()
    profiler.stop()
    stop_s = time.perf_counter() - began
    folder = Path(tempfile.mkdtemp(prefix="capture-parts-"))
    raw, packed = folder / "trace.json", folder / "trace.json.gz"
    marks: list[tuple[str, float, float]] = []

    def gzip_trace() -> None:
        with open(raw, "rb") as source, gzip.open(packed, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)

    def work() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except OSError:
            pass
        time.sleep(0.05)
        for name, part in (("parse events (events())", profiler.events),
                           ("summary (key_averages, frames)", lambda: summarize(profiler, stack)),
                           ("export_chrome_trace", lambda: profiler.export_chrome_trace(str(raw))),
                           ("gzip", gzip_trace)):
            began = time.perf_counter()
            part()
            marks.append((name, began, time.perf_counter()))
        time.sleep(0.05)

    thread = threading.Thread(target=work)
    before = len(steps)
    thread.start()
    while thread.is_alive():
        step()
    median = statistics.median(end - begin for begin, end in steps[100:300])
    print(f"width {width}, stacks {'on' if stack else 'off'}: median step {median * 1e3:.3f} ms; "
          f"profiler start "
          f"{start_s * 1e3:.1f} ms, stop {stop_s * 1e3:.1f} ms; trace {raw.stat().st_size >> 10} KiB, "
          f"gzipped {packed.stat().st_size >> 10} KiB; load {os.getloadavg()[0]:.1f}")
    for name, a, b in marks:
        inside = [(s, e) for s, e in steps[before:] if e > a and s < b]
        lost = sum(max(0.0, (e - s) - median) for s, e in inside)
        print(f"  {name:32s} wall {1e3 * (b - a):8.1f} ms  steps overlapping {len(inside):5d}  "
              f"training lost {1e3 * lost:8.1f} ms")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
