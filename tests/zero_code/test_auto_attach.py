"""The start-up hook of zero-code tracing: where it attaches, that it imports nothing, opt-out, chaining."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zero_code.runner import clean_env
from traceml_otel.integrations.auto_attach import is_training_process, main_target
from traceml_otel.launch.bootstrap import BOOTSTRAP_DIR

PROBE = """
import json, os, sys
finder = [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_PostImportFinder"]
print(json.dumps({"finder": bool(finder), "torch": "torch" in sys.modules,
                  "transformers": "transformers" in sys.modules, "lightning": "lightning" in sys.modules,
                  "user_site": os.environ.get("USER_SITECUSTOMIZE_RAN"),
                  "boot_on_path": any(p.endswith("_boot") for p in sys.path)}))
"""


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "train.py", "--lr", "1"], ("script", "train.py")),
    (["python", "-u", "-W", "ignore", "train.py"], ("script", "train.py")),
    (["python", "-m", "torch.distributed.run", "x.py"], ("module", "torch.distributed.run")),
    (["python", "-mtraceml_otel.emit.worker"], ("module", "traceml_otel.emit.worker")),
    (["python", "-c", "from multiprocessing.spawn import spawn_main"], ("code", None)),
    (["python"], ("interactive", None)),
])
def test_main_target(argv: list[str], expected: tuple) -> None:
    assert main_target(argv) == expected


def test_attaches_in_the_script_s_processes_only(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    launched = {"TRACEML_BOOT_SCRIPT": str(script)}
    assert is_training_process(["python", "-u", str(script), "--x"], launched)
    assert not is_training_process(["python", "-u", str(tmp_path / "other.py")], launched)
    assert not is_training_process(["python", "-c", "spawn_main()"], launched)  # a DataLoader worker
    assert not is_training_process(["python", "-m", "traceml_otel.emit.worker"], launched)  # the emitter
    # a direct launch: not the launchers, not programs the training process starts
    assert is_training_process(["python", "train.py"], {})
    assert not is_training_process(["python", "/venv/bin/torchrun", "train.py"], {})
    assert not is_training_process(["python", "-m", "torch.distributed.run", "train.py"], {})
    assert not is_training_process(["python", "/venv/bin/accelerate", "launch", "train.py"], {})
    assert not is_training_process(["python", "helper.py"], {"TRACEML_AUTO_ATTACHED_PID": "1"})


def _probe(tmp_path: Path, env: dict[str, str], *, boot_script: bool = True) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    full = clean_env(tmp_path, {"PYTHONPATH": os.pathsep.join((str(BOOTSTRAP_DIR), str(tmp_path / "site"))),
                                "TRACEML_AUTO_ATTACH": "1", **env})
    if boot_script:
        full["TRACEML_BOOT_SCRIPT"] = str(script)
    result = subprocess.run([sys.executable, "-u", str(script)], env=full, capture_output=True, text=True,
                            timeout=60, check=True)
    return json.loads(result.stdout)


def test_the_hook_imports_no_framework_and_chains_to_the_user_s_sitecustomize(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    seen = _probe(tmp_path, {})
    assert seen == {"finder": True, "torch": False, "transformers": False, "lightning": False,
                    "user_site": "yes", "boot_on_path": False}
    assert _probe(tmp_path, {"TRACEML_AUTO_ATTACH": "0"})["finder"] is False  # the opt-out
    assert _probe(tmp_path, {}, boot_script=False)["finder"] is True  # a direct launch: python probe.py


def test_no_auto_attach_flag_reaches_the_ranks(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    for flag, expected in ((), True), (("--no-auto-attach",), False):
        result = subprocess.run(
            [sys.executable, "-m", "traceml_otel.cli", "run", *flag, "--no-report", str(script)],
            env=clean_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
        line = next(line for line in result.stdout.splitlines() if line.startswith("{"))
        assert json.loads(line)["finder"] is expected, result.stdout + result.stderr
