"""A real traced training loop for the live stack test: steps slow down part way, or the loader is slow.

Prints `slowdown <unix time>` when the slow phase starts. With --gpu-uuid it reports that CUDA
device to the emitter the way the CUDA clock does on a GPU (this machine has none), so the
info series carries a UUID the DCGM join can match.
"""

import argparse
import time

import torch
from torch import nn

import traceml_otel as traceml

parser = argparse.ArgumentParser()
parser.add_argument("--fast-seconds", type=float, required=True)
parser.add_argument("--slow-seconds", type=float, default=0.0)
parser.add_argument("--step", type=float, default=0.05, help="traced seconds per step before the slowdown")
parser.add_argument("--slow-step", type=float, default=0.12, help="traced seconds per step after it")
parser.add_argument("--loader-wait", type=float, default=0.005, help="seconds each batch takes to load")
parser.add_argument("--gpu-uuid", default="")
parser.add_argument("--flops", type=float, default=None, help="model FLOPs each step declares (MFU)")
parser.add_argument("--evaluate-every", type=int, default=0, help="a 0.2 s evaluation every N steps")
args = parser.parse_args()


class SlowDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(args.loader_wait)
        return torch.ones(8)


traceml.init(mode="auto")
if args.gpu_uuid:
    from traceml_otel.capture.session import TrainingSession, current

    session = current()
    assert isinstance(session, TrainingSession)
    session.link.send_device(0, args.gpu_uuid)  # as a CUDA rank's recorder would
torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=None, num_workers=0)
start = time.monotonic()
slow_since = None
steps_done = 0
for x in loader:
    elapsed = time.monotonic() - start
    if elapsed > args.fast_seconds + args.slow_seconds:
        break
    if elapsed > args.fast_seconds and slow_since is None:
        slow_since = time.time()
        print(f"slowdown {slow_since}", flush=True)
    with traceml.trace_step(model, flops=args.flops):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        time.sleep(args.step if slow_since is None else args.slow_step)
    steps_done += 1
    if args.evaluate_every and steps_done % args.evaluate_every == 0:
        with traceml.outside_step("evaluation"):
            time.sleep(0.2)
print("done", flush=True)
