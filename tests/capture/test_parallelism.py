"""``traceml.parallelism`` comes from the process, not from the object passed to ``trace_step``."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from torch import nn

from traceml_otel.capture.parallelism import WrapperRegistry, detect_parallelism


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    gc.collect()  # a test's DDP model (its reducer holds the group) dies before the group, never after
    dist.destroy_process_group()


def _detect(model=None, world_size=2, registry=None, accelerate=None, group=None) -> str:
    return detect_parallelism(
        model, world_size, registry, accelerate_type=lambda: accelerate, group_size=lambda: group
    )


@pytest.mark.parametrize(
    ("world_size", "accelerate", "group", "expected"),
    [
        (1, None, None, "none"),  # one process
        (1, "NO", 1, "none"),
        (2, None, None, "independent"),  # several processes, no process group: no collective possible
        (2, "NO", 2, "independent"),  # Accelerate on CPU without ACCELERATE_USE_CPU: a group, no DDP
        (2, "MULTI_CPU", 2, "ddp"),  # Accelerate prepared a DDP model (the user traces unwrap_model)
        (2, "MULTI_GPU", 2, "ddp"),
        (2, None, 2, "none"),  # a process group but no wrapper seen: ranks may sync by hand
        (1, None, 2, "none"),  # WORLD_SIZE unset, a 2-rank process group: ranks may still sync
    ],
)
def test_process_level_sources(world_size, accelerate, group, expected) -> None:
    assert _detect(nn.Linear(2, 2), world_size, None, accelerate, group) == expected


def test_no_model_still_tells_independent_processes() -> None:
    assert _detect(None, 2) == "independent"


def test_unwrapped_model_under_ddp_is_ddp_through_the_registry(process_group) -> None:
    from torch.nn.parallel import DistributedDataParallel

    registry = WrapperRegistry()
    registry.install()
    try:
        inner = nn.Linear(4, 4)
        ddp = DistributedDataParallel(inner)
        built_before = nn.Linear(4, 4)
    finally:
        registry.uninstall()
    assert "__wrapped__" not in DistributedDataParallel.__init__.__dict__  # uninstalled
    unseen_ddp = DistributedDataParallel(built_before)  # built after uninstall: not remembered
    assert _detect(ddp, 1, registry) == "ddp"
    assert _detect(inner, 1, registry) == "ddp"  # trace_step(accelerator.unwrap_model(model))
    assert _detect(inner, 2, registry, accelerate="NO", group=2) == "ddp"  # a wrapper beats the state
    assert _detect(built_before, 1, registry) == "none"
    assert _detect(unseen_ddp, 1, registry) == "ddp"


def test_fsdp2_fully_shard_is_fsdp_from_the_root_or_inside_the_tree(process_group) -> None:
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    fully_shard(model[0])
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()  # it really trains on CPU over gloo
    optimizer.step()
    assert _detect(model, 1) == "fsdp"
    holder = nn.Sequential(model)  # an unsharded parent around a sharded model
    assert _detect(holder, 1) == "fsdp"
    assert _detect(nn.Linear(2, 2), 1) == "none"
