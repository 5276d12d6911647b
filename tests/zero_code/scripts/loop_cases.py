"""Plain loops run without ``trace_step`` (steps inferred under zero-code tracing) or in
``trace_step`` blocks (test helper). The test runs both versions at the same time, in two processes,
so that both see the same machine load.

    loop_cases.py inferred|trace_step   # writes $WINDOWS_DIR/cases-<version>.json: [[case, start_ns, end_ns]]

``LOOP_UPDATES`` (5), ``LOOP_SLEEP_MS`` (150: each forward sleeps) and ``LOOP_WIDTH`` (16: the MLP's
hidden width) size the loops.

Cases: ``eval`` (a DataLoader, evaluation every 3 updates inside the loop), ``accumulation`` (3
micro-batches per update from a generator, no DataLoader), ``two_optimizers`` (a GAN-style
generator and discriminator, one update each per iteration, batches sliced from tensors) and
``accelerate`` (a prepared model, optimizer and loader, accumulation 2 through ``accumulate``).
"""

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

UPDATES = int(os.environ.get("LOOP_UPDATES", "5"))
SLEEP_S = float(os.environ.get("LOOP_SLEEP_MS", "150")) / 1e3
WIDTH = int(os.environ.get("LOOP_WIDTH", "16"))
"""The benchmark (benchmarks/inferred_steps_match.py) sets these: more updates, CPU-bound steps."""
ANCHOR = time.time_ns() - time.perf_counter_ns()
torch.manual_seed(0)
torch.set_num_threads(1)


def now():
    return ANCHOR + time.perf_counter_ns()


class Net(torch.nn.Module):
    """A tiny MLP whose forward also sleeps 150 ms: step times that CPU load barely moves, so the two
    versions' step durations compare where the step boundaries are, not how busy the machine was."""

    def __init__(self, width=WIDTH, out=1):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, out))

    def forward(self, x):
        if SLEEP_S:
            time.sleep(SLEEP_S)
        return self.layers(x)


def mlp():
    return Net()


def step_block(traced, model):
    if not traced:
        return contextlib.nullcontext()
    import traceml_otel as traceml

    return traceml.trace_step(model)


def case_eval(traced):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(8 * UPDATES, 64), torch.randn(8 * UPDATES, 1))
    val = DataLoader(TensorDataset(torch.randn(16, 64), torch.randn(16, 1)), batch_size=8)
    for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
        with step_block(traced, model):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if i % 3 == 2:
            model.eval()
            with torch.no_grad():
                for xv, yv in val:
                    torch.nn.functional.mse_loss(model(xv), yv)
            model.train()


def batches():
    while True:
        yield torch.randn(8, 64), torch.randn(8, 1)


def case_accumulation(traced):
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stream = batches()
    for _ in range(UPDATES):
        x, y = next(stream)  # an inferred step starts after its first fetch: so does the block
        with step_block(traced, model):
            for micro in range(3):
                if micro:
                    x, y = next(stream)
                (torch.nn.functional.mse_loss(model(x), y) / 3).backward()
            optimizer.step()
            optimizer.zero_grad()


def case_two_optimizers(traced):
    generator = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 64))
    discriminator = mlp()
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3)
    d_opt = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    real = torch.randn(8 * UPDATES, 64)
    for i in range(UPDATES):
        with step_block(traced, discriminator):
            x = real[i * 8:(i + 1) * 8]
            fake = generator(torch.randn(8, 16))
            d_opt.zero_grad()
            d_loss = discriminator(x).mean() - discriminator(fake.detach()).mean()
            d_loss.backward()
            d_opt.step()
            g_opt.zero_grad()
            (-discriminator(fake).mean()).backward()
            g_opt.step()
    del g_opt, d_opt  # later cases have one optimizer alive again


def case_accelerate(traced):
    """Accelerate with gradient accumulation 2: ``optimizer.step()`` is a no-op on the first micro-batch."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(16 * UPDATES, 64), torch.randn(16 * UPDATES, 1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    batches = iter(loader)
    for _ in range(UPDATES):
        x, y = next(batches)
        with step_block(traced, model):
            for micro in range(2):
                if micro:
                    x, y = next(batches)
                with accelerator.accumulate(model):
                    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                    optimizer.step()
                    optimizer.zero_grad()


CASES = {"eval": case_eval, "accumulation": case_accumulation, "two_optimizers": case_two_optimizers,
         "accelerate": case_accelerate}

if __name__ == "__main__":
    version = sys.argv[1]
    traced = version == "trace_step"
    windows = []
    for name, case in CASES.items():
        started = now()
        case(traced)
        windows.append([name, started, now()])
    Path(os.environ["WINDOWS_DIR"], f"cases-{version}.json").write_text(json.dumps(windows))
