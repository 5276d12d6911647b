"""The ranks each training pod runs, read from its Kubernetes manifest (``stack render --pod-spec``).

One rank per GPU is how torchrun-style jobs are run, so the GPUs a training container asks for
(``resources.limits`` or ``requests`` of ``nvidia.com/gpu``, ``amd.com/gpu`` or ``gpu.intel.com/i915``)
are the local ranks whose ports the PodMonitor must scrape. Any workload that holds a pod template
works: a Pod, Job, JobSet, PyTorchJob, StatefulSet...: every ``containers`` list anywhere in it is
read; the largest count wins (a launcher container next to the trainer asks for none). YAML needs
PyYAML (JSON does not); the file is read up to 1 MiB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.stack.config import StackConfigError

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")
MAX_SPEC_BYTES = 1 << 20
MAX_NODES = 100_000
"""Dicts and lists visited at most (a manifest is small; a hostile one stays bounded)."""


@dataclass(frozen=True, slots=True)
class PodGpus:
    """The GPU count found and where (``container NAME: nvidia.com/gpu``)."""

    count: int
    where: str


def _documents(text: str, path: Path) -> list[object]:
    try:
        return [json.loads(text)]
    except ValueError:
        pass
    try:
        import yaml
    except ImportError:
        raise StackConfigError(
            f"{path} is not JSON, and reading YAML needs PyYAML (pip install pyyaml)") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise StackConfigError(f"{path} is not valid YAML: {str(error)[:200]}") from None


def _containers(node: object) -> Iterator[dict[str, object]]:
    stack, seen = [node], 0
    while stack and seen < MAX_NODES:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    yield from (c for c in value if isinstance(c, dict) and key == "containers")
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _gpus(container: dict[str, object]) -> tuple[int, str] | None:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return None
    for kind in ("limits", "requests"):
        amounts = resources.get(kind)
        if not isinstance(amounts, dict):
            continue
        for name in GPU_RESOURCES:
            raw = amounts.get(name)
            try:
                count = int(str(raw).strip()) if raw is not None else 0
            except ValueError:
                continue
            if count > 0:
                return count, name
    return None


def pod_gpus(path: Path) -> PodGpus | None:
    """The most GPUs one container of the manifest at ``path`` asks for; ``None`` when none asks.

    Raises:
        StackConfigError: the file cannot be read or parsed.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as error:
        raise StackConfigError(f"cannot read {path}: {error.strerror or error}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise StackConfigError(f"{path} is over {MAX_SPEC_BYTES} bytes: not a pod manifest")
    best: PodGpus | None = None
    for document in _documents(data.decode("utf-8", "replace"), path):
        for container in _containers(document):
            found = _gpus(container)
            if found and (best is None or found[0] > best.count):
                name = str(container.get("name", "?"))[:63]
                best = PodGpus(found[0], f"container {name}: {found[1]}")
    return best
