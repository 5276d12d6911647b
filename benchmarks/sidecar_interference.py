"""Does a side process's CPU work slow the training thread on this machine? (No traceml involved.)

    .venv/bin/python benchmarks/sidecar_interference.py --burn-ms 9 --wake timer
    .venv/bin/python benchmarks/sidecar_interference.py --burn-ms 9 --wake pipe

A bare torch loop (one thread) runs blocks of steps in pairs: one with a niced side process stopped
(``SIGSTOP``), the next with it running. The side process burns ``--burn-ms`` of Python CPU (string
formatting, like the emitter's) per 256 steps: woken by the loop's write of 80 KB into a pipe every 256
steps (``--wake pipe``, as the trainer wakes its emitter) or on its own 0.25 s timer (``--wake
timer``). Adjacent blocks are compared, so slow drift of the machine cancels; printed: the median step
and the training thread's CPU per step, running minus stopped, median and quartiles over the pairs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

SIDE = r'''
import os, select, sys, time
os.nice(10)
fd, burn_s, wake = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
while True:
    if wake == "pipe":
        select.select([fd], [], [])
    else:
        time.sleep(0.25)
        if not select.select([fd], [], [], 0)[0]:
            continue
    batches = len(os.read(fd, 1 << 20)) // 80_000
    started = time.thread_time()
    while time.thread_time() - started < batches * burn_s:
        text = "%s,%d,%r" % ("abc" * 20, 123456789, 0.001234) * 3
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burn-ms", type=float, default=9.0, help="side CPU per 256 steps (ms)")
    parser.add_argument("--wake", choices=["pipe", "timer"], default="pipe")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--block-steps", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    import torch
    from torch import nn

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    side = subprocess.Popen([sys.executable, "-c", SIDE, str(read_fd), str(args.burn_ms / 1000), args.wake],
                            pass_fds=(read_fd,))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hidden = args.hidden
    model = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(64, hidden), torch.randint(0, 10, (64,))
    payload = b"x" * 80_000

    def block() -> tuple[float, float]:
        walls = []
        cpu_started = time.thread_time_ns()
        for step in range(args.block_steps):
            started = time.perf_counter_ns()
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()
            if step % 256 == 255:
                try:
                    os.write(write_fd, payload)
                except BlockingIOError:
                    pass
            walls.append(time.perf_counter_ns() - started)
        return statistics.median(walls), (time.thread_time_ns() - cpu_started) / args.block_steps

    try:
        time.sleep(1.0)
        steps, cpus, bare = [], [], []
        for _ in range(args.rounds):
            os.kill(side.pid, signal.SIGSTOP)
            time.sleep(0.05)
            stopped = block()
            os.kill(side.pid, signal.SIGCONT)
            running = block()
            steps.append(running[0] - stopped[0])
            cpus.append(running[1] - stopped[1])
            bare.append(stopped[0])
    finally:
        side.kill()
    low, _, high = statistics.quantiles(steps, n=4)
    print(f"side process {args.burn_ms} ms per 256 steps, woken by {args.wake}: bare step "
          f"{statistics.median(bare) / 1e6:.3f} ms; median step {statistics.median(steps) / 1000:+.1f} us "
          f"(quartiles {low / 1000:+.0f}..{high / 1000:+.0f}); training-thread CPU per step "
          f"{statistics.median(cpus) / 1000:+.1f} us")


if __name__ == "__main__":
    main()
