"""`traceml stack render`: Prometheus rules, Grafana dashboard and Kubernetes manifests from one source."""

from traceml_otel.stack.config import StackConfig, StackConfigError, Windows
from traceml_otel.stack.render import render_all, write_files

__all__ = ["StackConfig", "StackConfigError", "Windows", "render_all", "write_files"]
