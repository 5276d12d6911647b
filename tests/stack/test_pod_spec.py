"""`traceml stack render --pod-spec`: the PodMonitor scrapes one port per GPU the training pod asks for
(`--ranks-per-pod` defaults to it), so an 8-GPU pod's ranks 1-7 are not left unscraped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from traceml_otel.stack.config import StackConfigError
from traceml_otel.stack.pod_spec import pod_gpus

REPO = Path(__file__).resolve().parents[2]

JOB = """\
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  template:
    metadata: {labels: {traceml.io/scrape: "true"}}
    spec:
      initContainers:
        - name: fetch
          image: busybox
          resources: {limits: {nvidia.com/gpu: 16}}
      containers:
        - name: sidecar
          image: busybox
        - name: trainer
          image: trainer:1
          resources:
            limits: {nvidia.com/gpu: %s, memory: 64Gi}
"""

PYTORCH_JOB = {  # Kubeflow's PyTorchJob: requests only, the pod template two levels down
    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
    "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4, "template": {"spec": {"containers": [
        {"name": "pytorch", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}}}},
}


def _render(tmp: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "traceml_otel.cli", "stack", "render", "-o", str(tmp / "out"), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def _ports(tmp: Path) -> list[str]:
    monitor = yaml.safe_load((tmp / "out" / "kubernetes" / "podmonitor.yaml").read_text())
    return [endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]]


def test_gpu_count_of_the_training_container(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB % 8)
    assert pod_gpus(spec).count == 8 and "trainer" in pod_gpus(spec).where  # not the init container's
    pytorch = tmp_path / "pytorchjob.json"
    pytorch.write_text(json.dumps(PYTORCH_JOB))
    assert pod_gpus(pytorch).count == 4
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text(JOB.replace("nvidia.com/gpu: %s, ", "").replace("nvidia.com/gpu: 16", "cpu: 1"))
    assert pod_gpus(cpu) is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(StackConfigError):
        pod_gpus(bad)


def test_a_two_gpu_pod_rendering_scrapes_both_ports(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB % 2)
    done = _render(tmp_path, "--pod-spec", str(spec))
    assert done.returncode == 0, done.stderr
    assert _ports(tmp_path) == ["traceml-0", "traceml-1"]
    assert "2 ranks per pod: the GPUs" in done.stderr


def test_an_explicit_count_wins_and_a_short_one_is_said(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB % 8)
    done = _render(tmp_path, "--pod-spec", str(spec), "--ranks-per-pod", "4")
    assert done.returncode == 0, done.stderr
    assert len(_ports(tmp_path)) == 4
    assert "asks for 8 GPUs" in done.stderr and "never scraped" in done.stderr
    done = _render(tmp_path, "--pod-spec", str(tmp_path / "absent.yaml"))
    assert done.returncode == 2 and "cannot read" in done.stderr
