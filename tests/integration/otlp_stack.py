"""Real OTLP plumbing for integration tests: a receiver and a rotel collector.

    with OtlpHttpReceiver() as receiver, RotelCollector(receiver.endpoint) as collector:
        exporter = OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
        ...
        received = receiver.wait_for_spans(6, timeout=5)

Everything binds 127.0.0.1. These are helpers, not tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.integration.otlp_receiver import (
    LOCALHOST,
    OtlpHttpReceiver,
    ReceivedMetric,
    ReceivedSpan,
    attributes_dict,
)
from tests.ports import free_port
from tests.tools import PIP_TEST, missing

__all__ = [
    "OtlpHttpReceiver",
    "ReceivedMetric",
    "ReceivedSpan",
    "RotelCollector",
    "attributes_dict",
    "free_port",
    "port_open",
    "rotel_agent_path",
    "rotel_stack",
]


def port_open(port: int, host: str = LOCALHOST) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def rotel_agent_path() -> str:
    """The ``rotel-agent`` binary: inside the installed ``rotel`` package, else on PATH.

    Raises:
        FileNotFoundError: rotel is not installed.
    """
    spec = importlib.util.find_spec("rotel")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "rotel-agent"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("rotel-agent")
    if found is None:
        raise FileNotFoundError("rotel-agent not found: pip install rotel")
    return found


class RotelCollector:
    """A real ``rotel-agent`` on 127.0.0.1 forwarding OTLP to ``exporter_endpoint`` over HTTP.

    Receives OTLP gRPC at ``grpc_endpoint`` and OTLP/HTTP at ``http_endpoint``
    (traces and metrics). Its output goes to ``log_path`` (by default in a
    ``/tmp/rotel-*`` folder that is kept for debugging). The exporter compresses
    with gzip (rotel's default).
    """

    def __init__(
        self,
        exporter_endpoint: str,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 10.0,
    ) -> None:
        self.exporter_endpoint = exporter_endpoint
        self._workdir = Path(tempfile.mkdtemp(prefix="rotel-"))
        self.log_path = log_path or self._workdir / "rotel.log"
        self.extra_args = tuple(extra_args)
        self.start_timeout = start_timeout
        self.grpc_port = 0
        self.http_port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://{LOCALHOST}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """Base URL; the SDK's HTTP exporters need ``/v1/traces`` or ``/v1/metrics`` appended."""
        return f"http://{LOCALHOST}:{self.http_port}"

    def command(self) -> list[str]:
        return [
            rotel_agent_path(),
            "start",
            "--otlp-grpc-endpoint",
            f"{LOCALHOST}:{self.grpc_port}",
            "--otlp-http-endpoint",
            f"{LOCALHOST}:{self.http_port}",
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            self.exporter_endpoint,
            "--otlp-exporter-protocol",
            "http",
            # Distinct files per instance: the defaults live in /tmp and would be shared.
            "--pid-file",
            str(self._workdir / "rotel.pid"),
            "--log-file",
            str(self._workdir / "rotel-agent.log"),
            *self.extra_args,
        ]

    def start(self) -> RotelCollector:
        """Launch on fresh ports and wait until both receivers accept connections."""
        for _attempt in range(3):  # a port picked by free_port() can be taken meanwhile
            self.grpc_port, self.http_port = free_port(), free_port()
            if self._launch():
                return self
        raise RuntimeError(f"rotel-agent did not start; log:\n{self.log_tail()}")

    def _launch(self) -> bool:
        # ROTEL_* variables would override the flags; NO_COLOR keeps the log plain where honoured.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")} | {"NO_COLOR": "1"}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            if port_open(self.grpc_port) and port_open(self.http_port):
                return True
            time.sleep(0.02)
        self.stop()
        return False

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (rotel flushes what it holds), then SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> RotelCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def rotel_stack() -> Iterator[tuple[OtlpHttpReceiver, RotelCollector]]:
    """A receiver and a running rotel collector that exports to it (stopped after); without rotel, the
    test goes as :func:`tests.tools.missing` says."""
    with OtlpHttpReceiver() as receiver:
        collector = RotelCollector(receiver.endpoint)
        try:
            collector.start()
        except FileNotFoundError:
            missing("rotel (the rotel-agent collector)", PIP_TEST)
        try:
            yield receiver, collector
        finally:
            collector.stop()
