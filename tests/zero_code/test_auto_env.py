"""``TRACEML_AUTO=1``: zero-code tracing for direct launches (``torchrun``, ``python``), through the
``traceml-otel-auto.pth`` file the package installs into site-packages.

Real launches of unmodified scripts (no traceml import): ``torchrun --nproc-per-node 2`` of a Lightning
script with gradient accumulation, ``python`` of a plain loop, and the same loop without the variable.
Then the start-up file's contract, on cheap probes: off without the variable, the opt-outs, a bad
value, never installed twice, and an import that fails is one line on stderr, not a dead interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.zero_code.runner import REPO, clean_env, read_run
from traceml_otel.launch.bootstrap import BOOTSTRAP_DIR

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PTH_SOURCE = REPO / "traceml_otel" / "launch" / "traceml-otel-auto.pth"
ACCUMULATE = 4
PROBE = ("import json, sys\nprint(json.dumps({'finders': sum(type(f).__name__ == '_PostImportFinder' "
         "for f in sys.meta_path), 'loaded': any(n.startswith('traceml_otel') for n in sys.modules)}))\n")


@pytest.fixture(scope="module")
def direct_launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Three direct launches at the same time: (folder, output) each."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torch's torchrun script is missing from the environment"
    launches = {
        # the console script as its shebang runs it: python .../torchrun ...
        "torchrun-lightning": ([sys.executable, torchrun, "--nproc-per-node", "2",
                                str(SCRIPTS / "plain_lightning.py"), "out", "--accumulate", str(ACCUMULATE)],
                               {"TRACEML_AUTO": "1"}),
        "python-loop": ([sys.executable, str(SCRIPTS / "plain_loop.py")], {"TRACEML_AUTO": "1"}),
        "python-loop-unset": ([sys.executable, str(SCRIPTS / "plain_loop.py")], {}),
    }
    children = {}
    for name, (command, env) in launches.items():
        folder = tmp_path_factory.mktemp(name)
        log = open(folder / "output.txt", "w")  # closed below; a file, not a pipe: never blocks the child
        children[name] = (folder, log, subprocess.Popen(command, env=clean_env(folder, env), cwd=folder,
                                                        stdout=log, stderr=subprocess.STDOUT))
    results = {}
    for name, (folder, log, child) in children.items():
        try:
            child.wait(timeout=240)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()
        output = (folder / "output.txt").read_text()
        assert child.returncode == 0, f"{name}: {output[-6000:]}"
        results[name] = (folder, output)
    return results


def _run_dir(folder: Path) -> Path:
    (run_dir,) = (folder / "runs").iterdir()
    return run_dir


def test_torchrun_traces_an_unmodified_lightning_script_one_step_per_update(direct_launches: dict) -> None:
    folder, output = direct_launches["torchrun-lightning"]
    ranks = read_run(_run_dir(folder), 2)
    for rank, run in ranks.items():
        steps = run.steps
        assert len(steps) == 4, (rank, len(steps), output[-3000:])
        for step in steps:
            attrs = step.attributes
            assert attrs["traceml.step.source"] == "lightning" and attrs["traceml.parallelism"] == "ddp"
            assert attrs["traceml.optimizer.steps"] == 1 and attrs["traceml.rank"] == rank
            assert attrs["traceml.step.samples"] == 8 * ACCUMULATE  # every micro-batch of the update
            phases = run.phases(step)
            assert phases.count("forward") == phases.count("backward") == ACCUMULATE, phases
            assert phases.count("optimizer") == 1, phases
    assert "zero-code tracing" not in output and "nested" not in output, output[-3000:]


def test_python_traces_an_unmodified_plain_loop(direct_launches: dict) -> None:
    folder, output = direct_launches["python-loop"]
    (rank,) = read_run(_run_dir(folder), 1).values()
    assert len(rank.steps) == 6, output[-3000:]
    assert {s.attributes["traceml.step.source"] for s in rank.steps} == {"inferred"}
    for step in rank.steps:
        # evaluation in no step; the deep copy's forwards in steps 5 and 6 are not the model's
        assert rank.phases(step) == ["backward", "forward", "optimizer"]
    assert json.loads(output.strip().splitlines()[-1]) == {"traceml_loaded": True}


def test_without_the_variable_nothing_happens(direct_launches: dict) -> None:
    folder, output = direct_launches["python-loop-unset"]
    assert not (folder / "runs").exists()
    assert output.strip() == json.dumps({"traceml_loaded": False})  # not even a traceml module loaded


def _probe(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[dict, str]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    command = [sys.executable, *(args or (str(script),))]
    result = subprocess.run(command, env=clean_env(tmp_path, env), cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_the_start_up_file_s_switches(tmp_path: Path) -> None:
    assert _probe(tmp_path, {}) == ({"finders": 0, "loaded": False}, "")
    assert _probe(tmp_path, {"TRACEML_AUTO": "1"}) == ({"finders": 1, "loaded": True}, "")
    assert _probe(tmp_path, {"TRACEML_AUTO": "0"})[0]["finders"] == 0
    assert _probe(tmp_path, {"TRACEML_AUTO": "1", "TRACEML_AUTO_ATTACH": "0"})[0]["finders"] == 0  # opt-out
    assert _probe(tmp_path, {"TRACEML_AUTO": "1"}, "-c", PROBE)[0]["finders"] == 0  # python -c: no script
    seen, stderr = _probe(tmp_path, {"TRACEML_AUTO": "maybe"})
    assert seen["finders"] == 0 and "TRACEML_AUTO='maybe' is neither 1 nor 0" in stderr
    # traceml run's start-up hook and the variable in one process: hooks installed once
    both = {"TRACEML_AUTO": "1", "PYTHONPATH": str(BOOTSTRAP_DIR), "TRACEML_AUTO_ATTACH": "1"}
    assert _probe(tmp_path, both) == ({"finders": 1, "loaded": True}, "")


def test_a_failing_import_is_one_line_and_the_script_runs(tmp_path: Path) -> None:
    broken = tmp_path / "shadow" / "traceml_otel"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('a broken install')\n")
    seen, stderr = _probe(tmp_path, {"TRACEML_AUTO": "1", "PYTHONPATH": str(broken.parent)})
    assert seen == {"finders": 0, "loaded": False}
    assert stderr.splitlines() == ["traceml: TRACEML_AUTO is set, but zero-code tracing could not load: "
                                   "RuntimeError: a broken install"]


def test_the_installed_start_up_file_is_this_checkout_s() -> None:
    installed = Path(sysconfig.get_paths()["purelib"]) / PTH_SOURCE.name
    assert installed.is_file(), f"{installed} is missing: reinstall (pip install -e ., scripts/setup.sh)"
    assert installed.read_bytes() == PTH_SOURCE.read_bytes(), "stale: reinstall (pip install -e .)"


def test_a_wheel_and_an_editable_wheel_install_the_file_at_site_packages_root(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(REPO / "traceml_otel", source / "traceml_otel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for hook in ("build_wheel", "build_editable"):  # one process per hook, as pip runs them
        code = f"import sys, setuptools.build_meta as b; b.{hook}(sys.argv[1])"
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=source, capture_output=True,
                       timeout=120, check=True)
    wheels = sorted((tmp_path / "dist").glob("*.whl"))
    assert len(wheels) == 2 and any("editable" in w.name for w in wheels), wheels
    content = PTH_SOURCE.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            assert archive.read(PTH_SOURCE.name) == content, wheel.name  # at the root: site-packages
            (record,) = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
            lines = archive.read(record).decode().splitlines()
        assert f"{PTH_SOURCE.name},sha256={digest},{len(content)}" in lines, wheel.name  # pip uninstalls it
