"""Zero-code tracing: attach to the Hugging Face ``Trainer``, Lightning and plain loops at import.

The start-up hook (:mod:`traceml_otel.integrations.startup`: ``traceml run``'s ``sitecustomize``, or the
``.pth`` file with ``TRACEML_AUTO=1``) calls :func:`start_in_process` in each training process. It
puts one finder on ``sys.meta_path`` that watches a handful of module names and returns ``None`` for
every other import (a dictionary lookup); nothing is imported eagerly. When a watched module has
been executed, its action runs:

- ``transformers.trainer``: ``Trainer.train`` (subclasses included) first adds a
  :class:`~traceml_otel.integrations.hf_trainer.TraceMLCallback` unless the trainer already has one;
- ``lightning.pytorch.trainer.trainer`` / ``pytorch_lightning.trainer.trainer``: ``Trainer.fit`` does
  the same with the Lightning callback of that package;
- ``torch``: at the loop's first batch fetch or module call, telemetry starts (``traceml.init()``,
  unless the script called it) and steps of a plain loop are inferred
  (:mod:`traceml_otel.capture.inferred_steps`) until the script calls ``trace_step`` or a framework
  callback takes over;
- ``accelerate.accelerator``: Accelerate's calls are timed (``AcceleratedOptimizer.step``).

Every action fails open: an error is said once on stderr and training goes on untraced.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from traceml_otel.errors import SettingsError
from traceml_otel.settings import (
    TRACEML_AUTO,
    TRACEML_AUTO_ATTACHED_PID,
    auto_attach_requested,
    auto_attached_pid,
    auto_requested,
    boot_script,
)

if TYPE_CHECKING:
    from traceml_otel.capture.inferred_steps import InferredSteps

_LAUNCHER_MODULES = ("torch.distributed", "accelerate", "traceml_otel", "multiprocessing", "pip",
                     "deepspeed", "pytest", "ensurepip", "venv")
_LAUNCHER_SCRIPTS = ("torchrun", "accelerate", "deepspeed", "traceml", "traceml-otel", "pip", "pip3")
_finder: _PostImportFinder | None = None


def _warn(message: str) -> None:
    print(f"traceml: {message}", file=sys.stderr, flush=True)


def main_target(argv: Sequence[str]) -> tuple[str, str | None]:
    """What a Python command line runs: ``("script", path)``, ``("module", name)``, ``("code", None)``
    or ``("interactive", None)`` (``sys.orig_argv``: the interpreter first)."""
    index = 1
    while index < len(argv):
        token = argv[index]
        if token == "-c" or (token.startswith("-c") and not token.startswith("--")):
            return "code", None
        if token == "-m":
            return "module", argv[index + 1] if index + 1 < len(argv) else None
        if token.startswith("-m") and not token.startswith("--"):
            return "module", token[2:]
        if token in ("-W", "-X", "--check-hash-based-pycs"):
            index += 2
            continue
        if token == "-" or not token.startswith("-"):
            return ("script", token) if token != "-" else ("interactive", None)
        index += 1
    return "interactive", None


def is_training_process(argv: Sequence[str], env: dict[str, str] | os._Environ[str]) -> bool:
    """True in the process running the user's script: not a launcher, worker or helper it starts."""
    kind, target = main_target(argv)
    expected = boot_script(env)
    if expected:  # traceml run: exactly the ranks of its script
        return kind == "script" and target is not None and _same_file(target, expected)
    owner = auto_attached_pid(env)
    if owner and owner != str(os.getpid()):
        return False  # a program the training process started
    if kind == "module" and target is not None:
        return not target.startswith(_LAUNCHER_MODULES)
    if kind == "script" and target is not None:
        return Path(target).name not in _LAUNCHER_SCRIPTS
    return False


def _same_file(one: str, other: str) -> bool:
    try:
        return Path(one).resolve() == Path(other).resolve()
    except OSError:
        return False


class _PostImportLoader(importlib.abc.Loader):
    """Runs the real loader, then an action on the executed module; leaves the module as it found it."""

    def __init__(self, loader: Any, action: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._action = action

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run_action(self._action, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _run_action(action: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        action(module)
    except Exception as error:
        _warn(f"zero-code tracing could not attach to {module.__name__}: {type(error).__name__}: {error}")


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Watches a few module names; every other import costs one dictionary lookup."""

    def __init__(self, actions: dict[str, Callable[[ModuleType], None]]) -> None:
        self.actions = actions
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        action = self.actions.get(fullname)
        if action is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _PostImportLoader(spec.loader, action)
        return spec


def start_in_process(argv: Sequence[str] | None = None, requested_by: str = "traceml run") -> bool:
    """Install the import hooks in this process if it is a training process; True when installed.

    ``requested_by``: ``traceml run`` (its start-up hook) or ``TRACEML_AUTO`` (the ``.pth`` file of a
    direct launch, which starts nothing when the variable says off or is not a yes/no value)."""
    global _finder
    if requested_by == TRACEML_AUTO:
        try:
            if not auto_requested():
                return False
        except SettingsError as error:
            _warn(f"{error}; zero-code tracing is off")
            return False
    attach, infer = auto_attach_requested()
    argv = list(getattr(sys, "orig_argv", None) or sys.argv) if argv is None else argv
    if not attach or _finder is not None or not is_training_process(argv, os.environ):
        return False
    if not boot_script():
        os.environ[TRACEML_AUTO_ATTACHED_PID] = str(os.getpid())  # programs it starts do not attach
    actions: dict[str, Callable[[ModuleType], None]] = {
        "transformers.trainer": patch_hf_trainer,
        "lightning.pytorch.trainer.trainer": functools.partial(patch_lightning, package="lightning.pytorch"),
        "pytorch_lightning.trainer.trainer": functools.partial(patch_lightning, package="pytorch_lightning"),
        "accelerate.accelerator": _accelerate_imported,
    }
    if infer:
        actions["torch"] = _torch_imported
    _finder = _PostImportFinder(actions)
    sys.meta_path.insert(0, _finder)
    for name, action in actions.items():  # imported before us (rare: a sitecustomize of the user's)
        module = sys.modules.get(name)
        if module is not None:
            _run_action(action, module)
    return True


def _wrap_entry(cls: type, name: str, attach: Callable[[Any], None]) -> None:
    """``cls.name`` first runs ``attach(self)``; once per class."""
    original = cls.__dict__[name]
    if getattr(original, "__traceml_auto__", False):
        return

    @functools.wraps(original)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            attach(self)
        except Exception as error:
            _warn(f"zero-code tracing could not attach to {type(self).__name__}: "
                  f"{type(error).__name__}: {error}; training goes on untraced")
        return original(self, *args, **kwargs)

    entry.__traceml_auto__ = True  # type: ignore[attr-defined]
    setattr(cls, name, entry)


def patch_hf_trainer(module: ModuleType) -> None:
    """``transformers.Trainer.train`` adds our callback first, unless the trainer has one."""
    _wrap_entry(module.Trainer, "train", attach_hf_callback)


def attach_hf_callback(trainer: Any) -> None:
    """Add a :class:`TraceMLCallback` to ``trainer`` unless one (given by the script) is there."""
    from traceml_otel.integrations.hf_trainer import TraceMLCallback

    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    if not any(isinstance(callback, TraceMLCallback) for callback in callbacks):
        trainer.add_callback(TraceMLCallback())


def patch_lightning(module: ModuleType, package: str) -> None:
    """Lightning's ``Trainer.fit`` adds our callback first, unless the trainer has one."""
    _wrap_entry(module.Trainer, "fit", functools.partial(attach_lightning_callback, package=package))


def attach_lightning_callback(trainer: Any, package: str) -> None:
    """Append the Lightning callback of ``package`` to ``trainer.callbacks`` unless one is there."""
    from traceml_otel.integrations import lightning_callback

    ours = lightning_callback.built_classes() or (lightning_callback.callback_class(package),)
    if not any(isinstance(callback, ours) for callback in trainer.callbacks):
        trainer.callbacks.append(lightning_callback.callback_class(package)())


def _torch_imported(module: ModuleType) -> None:
    from traceml_otel.capture.inference_arming import arm_inference

    arm_inference(start_inference)


def start_inference() -> InferredSteps | None:
    """Start telemetry (``init()``, unless the script called it) and infer the steps of a plain loop
    until an explicit step appears; called at the loop's first fetch or module call."""
    from traceml_otel import session_root
    from traceml_otel.capture.session import current

    if not session_root.start_automatically():
        return None
    return current().start_inference()


def _accelerate_imported(module: ModuleType) -> None:
    from traceml_otel.capture.session import current

    current().catch_up_on_accelerate()
