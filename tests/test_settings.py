"""Environment parsing: endpoints, protocol choice, sampler, service name, run ids, bad values."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from traceml_otel.errors import SettingsError
from traceml_otel.settings import load_settings


def test_no_endpoint_means_no_export() -> None:
    settings = load_settings({})
    assert settings.traces is None and settings.metrics is None
    assert settings.run_dir is not None and settings.run_dir.parent.name == "traceml-runs"


@pytest.mark.parametrize(("env", "expected"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "grpc"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
     "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "grpc"),
])
def test_protocol_is_chosen_explicitly(env: dict[str, str], expected: str) -> None:
    assert load_settings(env).traces.protocol == expected


def test_per_signal_endpoints_and_exporter_none() -> None:
    settings = load_settings({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces",
                              "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert settings.traces.endpoint == "http://t:4318/v1/traces"
    assert settings.metrics is None


@pytest.mark.parametrize(("env", "message"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, "thrift"),
    ({"TRACEML_FLUSH_STEPS": "zero"}, "TRACEML_FLUSH_STEPS"),
    ({"TRACEML_FLUSH_STEPS": "0"}, ">= 1"),
])
def test_bad_values_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(env)


def test_service_name_defers_to_otel_variables() -> None:
    assert load_settings({"TRACEML_RUN_NAME": "bert"}).service_name == "traceml-bert"
    assert load_settings({"OTEL_SERVICE_NAME": "x"}).service_name is None
    assert load_settings({"OTEL_RESOURCE_ATTRIBUTES": "a=b,service.name=y"}).service_name is None


def test_run_id_sources() -> None:
    assert load_settings({"TRACEML_RUN_ID": "r1", "TORCHELASTIC_RUN_ID": "e"}).run_id == "r1"
    # torchrun's id, after the script name: a folder a person can find (script name plus id)
    elastic = {"TORCHELASTIC_RUN_ID": "job-7", "TRACEML_RUN_NAME": "train"}
    assert load_settings(elastic).run_id == "train-job-7"
    plain = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert load_settings(plain).run_id == load_settings(plain).run_id  # ranks of one torchrun agree
    assert load_settings({}).run_id != load_settings({}).run_id


def test_rank_identity_and_switches() -> None:
    settings = load_settings({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "1",
                              "TRACEML_LOCAL_COPY": "0", "OTEL_SDK_DISABLED": "true"})
    identity = settings.identity
    assert (identity.rank, identity.local_rank, identity.world_size, identity.node_rank) == (3, 1, 8, 1)
    assert settings.run_dir is None and settings.sdk_disabled


def test_prometheus_port() -> None:
    assert load_settings({}).prometheus_port is None
    assert load_settings({"TRACEML_PROMETHEUS_PORT": "9464"}).prometheus_port == 9464
    with pytest.raises(SettingsError, match="TRACEML_PROMETHEUS_PORT"):
        load_settings({"TRACEML_PROMETHEUS_PORT": "ninety"})


def test_prometheus_bind_address_and_linger() -> None:
    default = load_settings({"TRACEML_PROMETHEUS_PORT": "9464"})
    assert default.prometheus_addr == "127.0.0.1" and default.prometheus_linger_s == 20.0
    assert load_settings({}).prometheus_linger_s == 0.0  # no endpoint, nothing to keep up
    wide = load_settings({"TRACEML_PROMETHEUS_PORT": "9464", "TRACEML_PROMETHEUS_ADDR": "0.0.0.0",
                          "TRACEML_PROMETHEUS_LINGER_S": "0"})
    assert wide.prometheus_addr == "0.0.0.0" and wide.prometheus_linger_s == 0.0
    assert load_settings({"TRACEML_PROMETHEUS_ADDR": "[::1]"}).prometheus_addr == "::1"
    with pytest.raises(SettingsError, match="TRACEML_PROMETHEUS_ADDR"):
        load_settings({"TRACEML_PROMETHEUS_ADDR": "pod.example"})


def test_collectives_switch() -> None:
    assert load_settings({}).collectives
    assert load_settings({"TRACEML_COLLECTIVES": "1"}).collectives
    for off in ("0", "false", "OFF", " no "):
        assert not load_settings({"TRACEML_COLLECTIVES": off}).collectives


def test_job_identity_survives_a_restart_under_a_new_run_id() -> None:
    from traceml_otel.settings import job_identity

    assert job_identity({"TRACEML_JOB": "llama-ft"}, "r-1") == "llama-ft"
    assert job_identity({"TRACEML_JOB": "x", "SLURM_JOB_ID": "4242"}, "r-1") == "x"  # explicit first
    assert job_identity({"TORCHELASTIC_RUN_ID": "rdzv-7"}, "r-1", "train") == "train-rdzv-7"
    assert job_identity({"TORCHELASTIC_RUN_ID": "rdzv-7", "SLURM_JOB_ID": "4242"}, "r-1") == "4242"
    assert job_identity({"TORCHELASTIC_RUN_ID": "none"}, "r-1") == "r-1"
    # traceml run's standalone rendezvous id is new each launch: not an identity
    assert job_identity({"TORCHELASTIC_RUN_ID": "9f2c", "TRACEML_LAUNCHER": "traceml-run"}, "r-1") == "r-1"
    assert job_identity({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain"}, "r-1") == "pretrain-4242"
    assert job_identity({}, "r-1") == "r-1"  # no identity: each attempt is a job of its own
    assert job_identity({"TRACEML_JOB": "a\x1bb" + "c" * 300}, "r-1") == "ab" + "c" * 126
    first = load_settings({"TRACEML_JOB": "nightly", "TRACEML_RUN_ID": "attempt-1"})
    second = load_settings({"TRACEML_JOB": "nightly", "TRACEML_RUN_ID": "attempt-2"})
    assert first.job == second.job == "nightly" and first.run_id != second.run_id


@pytest.mark.parametrize("name", ["TRACEML_SHUTDOWN_TIMEOUT_S", "TRACEML_EMITTER_STALL_S",
                                  "TRACEML_HANG_TIMEOUT_S", "TRACEML_HANG_FACTOR"])
def test_durations_and_factors_take_decimals(name: str) -> None:
    field = {"TRACEML_SHUTDOWN_TIMEOUT_S": "shutdown_timeout_s", "TRACEML_EMITTER_STALL_S": "emitter_stall_s",
             "TRACEML_HANG_TIMEOUT_S": "hang_timeout_s", "TRACEML_HANG_FACTOR": "hang_factor"}[name]
    assert getattr(load_settings({name: " 2.5 "}), field) == 2.5
    for bad, message in (("2,5", "is not a number"), ("nan", "not a finite number"), ("-1", ">= ")):
        with pytest.raises(SettingsError, match=f"{name}=.*{message}"):
            load_settings({name: bad})
    assert load_settings({"TRACEML_PROMETHEUS_PORT": "9464",
                          "TRACEML_PROMETHEUS_LINGER_S": "30.5"}).prometheus_linger_s == 30.5


def test_the_launcher_reads_the_shutdown_timeout_as_the_ranks_do() -> None:
    """The launcher waits for the ranks' last exports as long as the ranks' own parser says; a value
    the ranks refuse (they say so and export nothing) leaves the launcher at the default."""
    from traceml_otel.launch.launcher import ranks_shutdown_timeout_s

    for raw in ("2.5", "0", "7", ""):
        env = {"TRACEML_SHUTDOWN_TIMEOUT_S": raw}
        assert ranks_shutdown_timeout_s(env) == load_settings(env).shutdown_timeout_s
    assert ranks_shutdown_timeout_s({"TRACEML_SHUTDOWN_TIMEOUT_S": "soon"}) == 10.0


def test_the_launcher_and_the_ranks_agree_on_the_run_folder(tmp_path) -> None:
    from traceml_otel.launch.launcher import LaunchOptions, resolve_run_id
    from traceml_otel.settings import runs_dir

    env = {"TRACEML_RUN_ID": " r-7 ", "TRACEML_RUNS_DIR": f" {tmp_path} "}
    launched = runs_dir(env) / resolve_run_id(LaunchOptions(script="train.py"), env)
    assert launched == load_settings(env).run_dir == tmp_path.resolve() / "r-7"


_ENV_READERS = ("get", "getenv", "pop", "setdefault")
# the start-up filter and hook may not import the rest of traceml_otel before they know they attach
_EXEMPT = ("settings.py", "integrations/startup.py", "launch/_boot/sitecustomize.py")


def _traceml_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("TRACEML_"):
        return node.value
    if isinstance(node, ast.Name) and node.id.startswith("TRACEML_"):
        return node.id
    return None


def test_only_settings_reads_traceml_variables() -> None:
    """No module outside settings.py names a TRACEML_* variable of its own or reads one from an
    environment mapping (``env.get(TRACEML_X)``, ``os.environ[TRACEML_X]``, ``os.getenv("TRACEML_X")``)."""
    package = Path(__file__).resolve().parents[1] / "traceml_otel"
    modules = sorted(package.rglob("*.py"))
    found = []
    for path in modules:
        relative = path.relative_to(package).as_posix()
        if relative in _EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), relative)):
            if isinstance(node, ast.Assign) and _traceml_name(node.value):
                found.append(f"{relative}:{node.lineno} defines {_traceml_name(node.value)}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _ENV_READERS and node.args and _traceml_name(node.args[0])):
                found.append(f"{relative}:{node.lineno} reads {_traceml_name(node.args[0])}")
            if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                    and _traceml_name(node.slice)):
                found.append(f"{relative}:{node.lineno} reads {_traceml_name(node.slice)}")
    assert len(modules) > 50 and found == []


def test_job_identity_is_the_schedulers_where_there_is_one() -> None:
    from traceml_otel.settings import job_identity

    k8s = {"TRACEML_K8S_NAMESPACE": "team-a", "TRACEML_K8S_JOB": "train",
           "TRACEML_K8S_JOB_UID": "3f1c2b7a-9d1e-4f00-8a6b-1234567890ab"}
    assert job_identity(k8s, "r-1") == "team-a/train/3f1c2b7a"
    # a Job of the same name in another namespace is another job
    assert job_identity({**k8s, "TRACEML_K8S_NAMESPACE": "team-b"}, "r-1") == "team-b/train/3f1c2b7a"
    assert job_identity({"TRACEML_K8S_JOB": "train"}, "r-1") == "train"
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pt", "SLURM_CLUSTER_NAME": "eu"}
    assert job_identity(slurm, "r-1") == "eu/pt-4242"
    assert job_identity({**k8s, "SLURM_JOB_ID": "4242"}, "r-1") == "team-a/train/3f1c2b7a"
    assert job_identity({**k8s, "TRACEML_JOB": "mine"}, "r-1") == "mine"  # the user's own setting wins


def test_run_name_names_the_job_only_without_a_scheduler_identity(tmp_path: Path) -> None:
    """``traceml run --run-name`` under a Kubernetes Job: the ranks' job is the Job's identity."""
    import subprocess
    import sys

    script = tmp_path / "show.py"
    script.write_text("import traceml_otel.settings as s, os\n"
                      "print('JOB', s.job_identity(os.environ, 'rid'))\n")
    repo = Path(__file__).resolve().parents[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    base.update(PYTHONPATH=str(repo), TRACEML_RUNS_DIR=str(tmp_path / "runs"), TRACEML_AUTO_ATTACH="0")
    k8s = {"TRACEML_K8S_NAMESPACE": "ns", "TRACEML_K8S_JOB": "j"}
    for extra, expected in ((k8s, "JOB ns/j"), ({}, "JOB nightly")):
        result = subprocess.run([sys.executable, "-m", "traceml_otel.cli", "run", "--run-name", "nightly",
                                 str(script)], env={**base, **extra}, cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert expected in result.stdout, result.stdout + result.stderr


# --- one on/off parser for every boolean TRACEML_* variable -------------------------------------------

def _booleans_read_by_settings() -> set[str]:
    """The variables settings.py hands to ``flag`` (read from its source, so a new one is seen)."""
    source = (Path(__file__).resolve().parents[1] / "traceml_otel" / "settings.py").read_text()
    tree = ast.parse(source)
    return {
        node.args[1].id for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "flag"
        and isinstance(node.args[1], ast.Name)
    }


def _read_with(name: str):
    from traceml_otel.settings import auto_attach_requested, auto_requested

    if name == "TRACEML_AUTO":
        return lambda env: auto_requested(env)
    if name in ("TRACEML_AUTO_ATTACH", "TRACEML_INFER_STEPS"):
        return lambda env: auto_attach_requested(env)
    if name.startswith("TRACEML_CAPTURE"):
        from traceml_otel.settings import capture_settings

        return lambda env: capture_settings(env)
    return lambda env: load_settings(env)


BOOLEANS = ("TRACEML_AUTO", "TRACEML_AUTO_ATTACH", "TRACEML_CAPTURE", "TRACEML_CAPTURE_AUTO",
            "TRACEML_CAPTURE_SHAPES", "TRACEML_CAPTURE_STACK", "TRACEML_COLLECTIVES", "TRACEML_DISABLED",
            "TRACEML_INFER_STEPS", "TRACEML_LOCAL_COPY", "TRACEML_STRICT")


def test_every_boolean_variable_goes_through_the_one_parser() -> None:
    assert _booleans_read_by_settings() == set(BOOLEANS)
    source = (Path(__file__).resolve().parents[1] / "traceml_otel" / "settings.py").read_text()
    assert '"false", "no", "off")' not in source  # no second spelling of the rule


@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize("typo", ["of", "tru", "2", "yes please"])
def test_a_typo_in_any_boolean_variable_is_refused_on_one_line_naming_it(name: str, typo: str) -> None:
    with pytest.raises(SettingsError) as raised:
        _read_with(name)({name: typo})
    message = str(raised.value)
    assert message.startswith(f"{name}=") and "neither 1 nor 0" in message and "\n" not in message


@pytest.mark.parametrize("name", BOOLEANS)
def test_every_boolean_variable_reads_the_same_words(name: str) -> None:
    read = _read_with(name)
    for word in ("1", "true", "YES", " on ", "0", "false", "No", "OFF", ""):
        read({name: word})  # none refused


def test_the_booleans_mean_what_they_say() -> None:
    from traceml_otel.settings import auto_attach_requested, auto_requested, strict_requested

    assert load_settings({"TRACEML_LOCAL_COPY": "off"}).run_dir is None
    assert load_settings({"TRACEML_LOCAL_COPY": "yes"}).run_dir is not None
    assert load_settings({"TRACEML_STRICT": "on"}).strict
    assert not load_settings({"TRACEML_STRICT": "no"}).strict
    assert load_settings({"TRACEML_DISABLED": "true"}).sdk_disabled
    assert not load_settings({"TRACEML_DISABLED": "0"}).sdk_disabled
    assert (auto_requested({"TRACEML_AUTO": "on"}), auto_requested({})) == (True, False)
    assert auto_attach_requested({}) == (True, True)
    assert auto_attach_requested({"TRACEML_INFER_STEPS": "false"}) == (True, False)
    assert auto_attach_requested({"TRACEML_AUTO_ATTACH": "0", "TRACEML_INFER_STEPS": "1"}) == (False, False)
    # the fallback reader init() consults when the settings are refused: its own typo reads as off
    assert strict_requested({"TRACEML_STRICT": "tru"}) is False
    # OTEL_SDK_DISABLED keeps the OpenTelemetry specification's rule: only "true" is true
    assert load_settings({"OTEL_SDK_DISABLED": "TRUE"}).sdk_disabled
    assert not load_settings({"OTEL_SDK_DISABLED": "1"}).sdk_disabled


def test_a_typo_turns_telemetry_off_with_one_line_and_the_script_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = ("import traceml_otel as traceml\n"
              "print('active', traceml.init())\n"
              "with traceml.trace_step():\n    pass\n"
              "print('done')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "OTEL_"))}
    env.update(TRACEML_LOCAL_COPY="of", TRACEML_RUNS_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env=env, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["active False", "done"]
    lines = [line for line in result.stderr.splitlines() if line.startswith("traceml:")]
    assert lines == ["traceml: telemetry disabled: TRACEML_LOCAL_COPY='of' is neither 1 nor 0"]
    assert list(tmp_path.iterdir()) == []  # nothing written
    env["TRACEML_STRICT"] = "1"  # strict: init() raises the same one line
    strict = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env=env, cwd=tmp_path, check=False)
    assert strict.returncode == 1
    assert "SettingsError: TRACEML_LOCAL_COPY='of' is neither 1 nor 0" in strict.stderr
