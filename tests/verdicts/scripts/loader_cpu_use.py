"""A training loop held up by its DataLoader, whose workers are as many as the CPUs beside the loop:
``--waits`` each sample waits (a sleep, as a network or slow-storage read does) and uses no CPU;
``--computes`` each sample burns CPU (as decoding and augmenting do); ``--start-method forkserver``
starts the workers as Python 3.14 does by default on Linux (children of a server process)."""

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_otel as traceml


class Samples(Dataset):  # module level: a forkserver worker imports it
    def __init__(self, computes: bool) -> None:
        self.computes = computes

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        if self.computes:
            end = time.thread_time() + 0.0008
            while time.thread_time() < end:
                pass
        else:
            time.sleep(0.0008)
        return torch.full((64,), float(index % 7)), index % 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--computes", action="store_true")
    parser.add_argument("--start-method", default=None, help="the workers' multiprocessing start method")
    args = parser.parse_args()
    torch.set_num_threads(1)
    traceml.init(mode="auto")
    workers = max(1, len(os.sched_getaffinity(0)) - 1)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Samples(args.computes), batch_size=16, num_workers=workers, persistent_workers=True,
                        multiprocessing_context=args.start_method)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        with traceml.trace_step(model):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
