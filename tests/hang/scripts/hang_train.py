"""A small training loop that hangs on purpose: ``hang_train.py SCENARIO [STEP]``.

Scenarios (rank 1 misbehaves in 2-rank jobs; rank 0 in a single process): ``sleep`` (user code,
time.sleep, before the forward), ``spin`` (pure-Python loop holding the GIL), ``cread`` (a C call that
released the GIL: a read on a pipe nobody writes), ``cspin`` (a C loop that never releases the GIL:
``sum(range(...))``), ``extra`` (one extra all_reduce of another size in the middle of training),
``extra_barrier`` and ``extra_exit`` (one extra all_reduce after the last step while the other rank goes
on to a barrier, or to ``destroy_process_group`` and exits), ``broadcast`` (a broadcast where the other
rank calls all_reduce), ``loader`` (a DataLoader worker blocks, num_workers=2), ``generator`` (the batch
generator blocks), ``slowing`` (steps slow down, never hang), ``evaluation`` (a long outside_step block,
never a hang), ``checkpoint`` (rank 0 saves in a long outside_step block while rank 1 waits for it in
DDP's all-reduce: never a hang).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import traceml_otel as traceml

SCENARIO = sys.argv[1]
AT = int(sys.argv[2]) if len(sys.argv) > 2 else 6
STEPS = int(os.environ.get("HANG_TEST_STEPS", "12"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))
CULPRIT = 1 if WORLD > 1 else 0


def stuck_in_user_code():
    time.sleep(3600)  # HANG-SLEEP


def spin_holding_the_gil():
    total = 0
    while True:  # HANG-SPIN
        total += 1


def c_loop_holding_the_gil():
    return sum(range(10**14))  # HANG-CSPIN


def blocked_in_c_call():
    read_end, _write_end = os.pipe()
    os.read(read_end, 1)  # HANG-CREAD


class BlockingDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        if index == AT * 4:
            time.sleep(3600)  # HANG-WORKER
        return torch.randn(8), torch.randn(1)


def batches():
    step = 0
    while True:
        if step == AT:
            time.sleep(3600)  # HANG-GENERATOR
        yield torch.randn(4, 8), torch.randn(4, 1)
        step += 1


def main():
    traceml.init()
    if WORLD > 1:
        dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 1)
    if WORLD > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if SCENARIO == "loader":
        source = iter(torch.utils.data.DataLoader(BlockingDataset(), batch_size=4, num_workers=2))
    elif SCENARIO == "generator":
        source = batches()
    else:
        source = iter(lambda: (torch.randn(4, 8), torch.randn(1, 1).expand(4, 1)), None)
    for step in range(STEPS):
        x, y = next(source)
        if SCENARIO == "evaluation" and step == AT:
            with traceml.outside_step("evaluation"):
                time.sleep(float(os.environ.get("HANG_TEST_EVAL_S", "8")))
        if SCENARIO == "checkpoint" and step == AT and RANK == 0:  # the other ranks wait in their step
            with traceml.outside_step("checkpoint"):
                time.sleep(float(os.environ.get("HANG_TEST_EVAL_S", "8")))  # NO-HANG-CHECKPOINT
        with traceml.trace_step(model):
            if step == AT and RANK == CULPRIT:
                if SCENARIO == "sleep":
                    stuck_in_user_code()
                elif SCENARIO == "spin":
                    spin_holding_the_gil()
                elif SCENARIO == "cspin":
                    c_loop_holding_the_gil()
                elif SCENARIO == "cread":
                    blocked_in_c_call()
                elif SCENARIO == "extra":
                    dist.all_reduce(torch.ones(3))  # HANG-EXTRA
                elif SCENARIO == "extra_big":  # larger than DDP's gradient bucket (9 floats)
                    dist.all_reduce(torch.ones(100))  # HANG-EXTRA-BIG
                elif SCENARIO == "broadcast":
                    dist.broadcast(torch.ones(3), src=0)  # HANG-BROADCAST
            elif step == AT and SCENARIO == "broadcast":
                dist.all_reduce(torch.ones(3))  # HANG-ALLREDUCE
            if SCENARIO == "slowing":
                time.sleep(min(0.05 * 2 ** step, 20))  # slows from 0.05 s, doubling
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
    if SCENARIO in ("extra_barrier", "extra_exit") and RANK == CULPRIT:
        dist.all_reduce(torch.ones(3))  # HANG-EXTRA-END
    elif SCENARIO == "extra_barrier":
        dist.barrier()  # HANG-BARRIER
    if SCENARIO == "extra_exit":
        dist.destroy_process_group()
    print(f"rank {RANK} finished {STEPS} steps", flush=True)


if __name__ == "__main__":
    main()
