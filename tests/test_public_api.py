"""The public API: exported names, init's argument rules, fail-open, strict, manual wrappers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import traceml_otel
from traceml_otel.capture.capture_config import capture_config


def test_exported_members() -> None:
    assert traceml_otel.__all__ == sorted([
        "__version__", "declare_flops", "flush", "init", "outside_step", "resume_from", "shutdown",
        "trace_step", "wrap_backward", "wrap_dataloader_fetch", "wrap_forward", "wrap_h2d", "wrap_optimizer",
    ])


def test_mode_rules() -> None:
    assert capture_config("auto", {"forward": None}).forward
    assert not capture_config("manual", {}).backward
    selective = capture_config("selective", {"forward": True, "backward": None})
    assert selective.forward and not selective.backward
    with pytest.raises(ValueError, match="selective"):
        capture_config("auto", {"forward": True})
    with pytest.raises(ValueError, match="at least one"):
        capture_config("selective", {"forward": False})
    with pytest.raises(ValueError, match="mode must be"):
        capture_config("turbo", {})


def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    full_env.update(TRACEML_RUNS_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_fail_open_warns_once_and_training_runs(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        from traceml_otel.emit import channel
        def broken(*a, **k):
            raise OSError("no processes left")
        channel.EmitterChannel.__init__ = broken
        assert traceml.init() is False
        for _ in range(3):
            with traceml.trace_step(None):
                pass
        print("trained")
    """
    result = _python(code, tmp_path)
    assert result.returncode == 0 and "trained" in result.stdout
    assert result.stderr.count("traceml:") == 1 and "no processes left" in result.stderr


def test_strict_raises(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        from traceml_otel.emit import channel
        def broken(*a, **k):
            raise OSError("no processes left")
        channel.EmitterChannel.__init__ = broken
        traceml.init(strict=True)
    """
    assert "OSError" in _python(code, tmp_path).stderr
    assert "OSError" in _python(code.replace("strict=True", ""), tmp_path, TRACEML_STRICT="1").stderr


def test_strict_env_raises_on_a_bad_setting(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        traceml.init()
        print("continued")
    """
    strict = _python(code, tmp_path, TRACEML_STRICT="1", TRACEML_FLUSH_STEPS="many")
    assert strict.returncode != 0 and "SettingsError" in strict.stderr and "continued" not in strict.stdout
    lenient = _python(code, tmp_path, TRACEML_FLUSH_STEPS="many")
    assert lenient.returncode == 0 and "continued" in lenient.stdout
    assert lenient.stderr.count("traceml:") == 1 and "TRACEML_FLUSH_STEPS" in lenient.stderr


def test_init_is_idempotent_and_rejects_a_new_config(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        assert traceml.init(mode="manual")
        assert traceml.init(mode="manual")
        try:
            traceml.init(mode="auto")
        except RuntimeError as error:
            print("refused:", error)
    """
    result = _python(code, tmp_path)
    assert "refused" in result.stdout, result.stderr


def test_disabled_is_a_quiet_no_op(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        assert traceml.init() is False
        with traceml.trace_step(None):
            pass
    """
    result = _python(code, tmp_path, OTEL_SDK_DISABLED="true")
    assert result.returncode == 0 and result.stderr == ""
    assert not any(tmp_path.iterdir())


def test_user_exception_propagates_through_trace_step(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        traceml.init()
        try:
            with traceml.trace_step(None):
                raise KeyError("mine")
        except KeyError as error:
            print("propagated", error)
    """
    result = _python(code, tmp_path)
    assert "propagated 'mine'" in result.stdout, result.stderr


def test_manual_wrappers_record_phases_and_refuse_double_counting(tmp_path: Path) -> None:
    code = """
        import torch, traceml_otel as traceml
        traceml.init(mode="manual")
        model = traceml.wrap_forward(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        assert traceml.wrap_optimizer(opt) is opt
        loader = traceml.wrap_dataloader_fetch([torch.ones(2, 4)] * 3)
        for x in loader:
            with traceml.trace_step(model):
                traceml.wrap_backward(model(traceml.wrap_h2d(x).to(torch.float32)).sum()).backward()
                opt.step()
        traceml.shutdown()
    """
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    from tests.local_copy_reader import read_run

    (run_dir,) = tmp_path.iterdir()
    names = sorted(span.name for span in read_run(run_dir))
    assert names.count("traceml.step") == 3
    for phase in ("forward", "backward", "optimizer", "h2d"):
        assert names.count(f"traceml.{phase}") == 3, names
    steps = [s for s in read_run(run_dir) if s.name == "traceml.step"]
    assert all("traceml.input_wait.cpu_duration" in s.attributes for s in steps)
    refused = _python("import traceml_otel as t, torch\nt.init()\nt.wrap_forward(torch.nn.Linear(1, 1))",
                      tmp_path)
    assert "would double count" in refused.stderr


def test_trace_step_before_init_warns_once(tmp_path: Path) -> None:
    code = """
        import traceml_otel as traceml
        for _ in range(3):
            with traceml.trace_step(None):
                pass
    """
    result = _python(code, tmp_path)
    assert result.returncode == 0 and result.stderr.count("before traceml.init()") == 1


def test_a_provider_the_program_set_up_is_reused_not_replaced(tmp_path: Path) -> None:
    code = """
        import warnings
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        provider = TracerProvider(resource=Resource.create({"service.name": "my-trainer", "team": "nlp"}))
        trace.set_tracer_provider(provider)
        import traceml_otel as traceml
        traceml.init()
        with traceml.trace_step(None):
            pass
        traceml.shutdown()
        assert trace.get_tracer_provider() is provider
    """
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Overriding" not in result.stderr
    from tests.local_copy_reader import read_run

    (run_dir,) = tmp_path.iterdir()
    (span,) = read_run(run_dir)
    assert span.resource["service.name"] == "my-trainer" and span.resource["team"] == "nlp"
    assert span.resource["traceml.run.id"] == run_dir.name


def test_collective_timing_defaults() -> None:
    assert capture_config("auto", {}).collectives
    assert not capture_config("auto", {}, collectives=False).collectives
    assert not capture_config("manual", {}).collectives
    assert capture_config("manual", {}, collectives=True).collectives
    assert not capture_config("selective", {"forward": True}).collectives
    assert capture_config("selective", {"forward": True}, collectives=True).collectives
