"""The rank's OpenTelemetry resource, from its hello: what every span and metric of the rank carries."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource

from traceml_otel import contract as c
from traceml_otel.wire.hello import Hello


def build_resource(hello: Hello) -> Resource:
    """Our resource attributes, merged under ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME``."""
    attributes: dict[str, Any] = {
        "service.instance.id": f"{hello.run_id}/rank-{hello.rank}",
        "host.name": hello.host,
        "process.pid": hello.pid,
        c.ATTR_RUN_ID: hello.run_id,
        c.ATTR_JOB: hello.job or hello.run_id,
    }
    if hello.service_name:
        attributes["service.name"] = hello.service_name
    # Resource.create merges the env detector (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) under ours;
    # service.name is only ours when the env named none. A provider the program set up wins over both.
    resource = Resource.create(attributes)
    if hello.user_resource:
        resource = resource.merge(Resource({**hello.user_resource, c.ATTR_RUN_ID: hello.run_id}))
    return resource
