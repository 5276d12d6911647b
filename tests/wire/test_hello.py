"""The hello: typed, read field by field by the emitter, and refused when its version is not ours."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest

from tests.emit.test_emitter_faults import _hello
from traceml_otel import session_root
from traceml_otel.emit import emitter as emitter_module
from traceml_otel.emit import resource as resource_module
from traceml_otel.emit.worker import Emitter
from traceml_otel.settings import load_settings
from traceml_otel.wire.frames import WIRE_VERSION, FrameBuffer, WireError
from traceml_otel.wire.hello import Hello, WireVersionError, decode_hello, encode_hello


def _read(data: bytes) -> dict:
    buffer = FrameBuffer()
    buffer.feed(data)
    frame = buffer.next_frame()
    assert frame is not None
    return frame


def test_a_hello_survives_the_wire_whole() -> None:
    hello = replace(_hello(Path("/runs/x")), traces_endpoint="http://127.0.0.1:4318",
                    traces_protocol="http/protobuf", metrics_endpoint="http://127.0.0.1:4317",
                    metrics_protocol="grpc", sampler_arg="0.1", prometheus_port=9464, cpus=2,
                    user_resource={"team": "vision", "k8s.pod.uid": "abc", "shard": 3})
    frame = _read(encode_hello(hello))
    assert frame["t"] == "hello" and frame["v"] == WIRE_VERSION
    assert decode_hello(frame) == hello
    assert decode_hello({**frame, "a_key_a_newer_trainer_added": 1}) == hello


def test_a_broken_hello_is_a_clear_error() -> None:
    frame = _read(encode_hello(_hello(None)))
    with pytest.raises(WireVersionError, match=f"sent wire version 1, this emitter reads {WIRE_VERSION}"):
        decode_hello({**frame, "v": 1})
    with pytest.raises(WireVersionError) as error:
        decode_hello({key: value for key, value in frame.items() if key != "v"})
    assert error.value.rank == 0 and error.value.sent is None
    for broken, message in [
        ({key: value for key, value in frame.items() if key != "anchor_ns"}, "lacks 'anchor_ns'"),
        ({**frame, "rank": "0"}, "'rank' is str"),
        ({**frame, "rank": True}, "'rank' is bool"),
        ({**frame, "shutdown_timeout_s": None}, "'shutdown_timeout_s' is NoneType"),
        ({**frame, "traces_endpoint": "http://x"}, "traces endpoint or protocol without the other"),
        ({**frame, "user_resource": {"a": [1]}}, "user_resource"),
        ({**frame, "t": "steps"}, "not a hello"),
    ]:
        with pytest.raises(WireError, match=re.escape(message)):
            decode_hello(broken)


def test_the_emitter_reads_every_field_of_the_hello() -> None:
    source = inspect.getsource(emitter_module) + inspect.getsource(resource_module)
    unread = [spec.name for spec in fields(Hello) if f"hello.{spec.name}" not in source]
    assert unread == [], f"sent but never read by the emitter (read them or remove them): {unread}"


def test_the_shutdown_timeout_setting_reaches_the_emitter() -> None:
    settings = load_settings({"TRACEML_SHUTDOWN_TIMEOUT_S": "3", "TRACEML_LOCAL_COPY": "0"})
    hello = decode_hello(_read(encode_hello(session_root.hello(settings))))
    assert hello.shutdown_timeout_s == 3
    emitter = Emitter(hello)
    assert emitter.drain_s == 3
    emitter.finish("ok", 0, True)


MISMATCH = """
import sys
import traceml_otel as traceml
import traceml_otel.wire.hello as hello
hello.WIRE_VERSION = 1  # this trainer speaks version 1; its emitter (a fresh process) reads the current one
traceml.init(mode="manual")
for _ in range(100):
    with traceml.trace_step():
        pass
print("trained", flush=True)
"""


def test_a_version_mismatch_is_said_once_counted_and_training_goes_on(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TRACEML_RUNS_DIR": str(tmp_path), "TRACEML_RUN_NAME": "mismatch",
           "TRACEML_FLUSH_STEPS": "16"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", MISMATCH], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr
    assert time.monotonic() - started < 60  # no hang at shutdown (generous: a loaded CI machine)
    lines = [line for line in result.stderr.splitlines() if line.startswith("traceml:")]
    said = [line for line in lines if "wire version" in line and "rank 0" in line]
    assert len(said) == 1, lines
    assert f"sent wire version 1, this emitter reads {WIRE_VERSION}" in said[0]
    assert any(line.startswith("traceml: 100 step(s) could not be handed to the emitter") and
               f"wire version mismatch (trainer 1, emitter {WIRE_VERSION})" in line for line in lines), lines
    assert not list(tmp_path.glob("*/rank-0.traces.jsonl")), "a refused stream writes no spans"
