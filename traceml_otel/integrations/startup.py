"""Zero-code tracing at interpreter start-up: what both start-up paths run, before the script.

Two paths load it, each before the script's first line:

- ``TRACEML_AUTO=1`` with a direct launch (``torchrun``, ``accelerate launch``, ``python``): the
  ``traceml-otel-auto.pth`` file the package installs into site-packages calls :func:`start_from_pth`
  in every Python process that sees the variable (``setup.py`` installs it; without the variable the
  file costs one environment lookup);
- ``traceml run``: its ``sitecustomize`` (:mod:`traceml_otel.launch.bootstrap`) calls :func:`start`.

The ``.pth`` line marks ``sys.modules["traceml-otel-auto"]`` before it imports anything: Python 3.11
runs a virtual environment's ``.pth`` files twice, and a failed import must be reported once.

Both first filter on ``os`` and ``sys`` alone, so that processes that will not attach (DataLoader
workers, the emitter, the launchers, ``python -c``) load nothing more than this module; then
:func:`traceml_otel.integrations.auto_attach.start_in_process` decides exactly (and never installs its
hooks twice in one process, whichever path comes first). Nothing here ever stops the interpreter:
an error is one line on stderr and the script runs untraced.
"""

import os
import sys

_OFF = ("0", "false", "no", "off")


def _say(message: str) -> None:
    print(f"traceml: {message}", file=sys.stderr, flush=True)


def may_attach() -> bool:
    """A first filter: the opt-out (``TRACEML_AUTO_ATTACH=0``), ``python -c``, and under ``traceml
    run`` a command line that does not name its script (``TRACEML_BOOT_SCRIPT``)."""
    if os.environ.get("TRACEML_AUTO_ATTACH", "1").strip().lower() in _OFF:
        return False
    argv = getattr(sys, "orig_argv", None) or []
    if "-c" in argv[1:3]:
        return False
    script = os.environ.get("TRACEML_BOOT_SCRIPT")
    return not script or any(os.path.basename(arg) == os.path.basename(script) for arg in argv[1:])


def start(requested_by: str = "traceml run") -> bool:
    """Install zero-code tracing in this process if it is a training process; True when installed."""
    if not may_attach():
        return False
    try:
        from traceml_otel.integrations import auto_attach  # its neighbour: integrations sit above launch

        return auto_attach.start_in_process(requested_by=requested_by)
    except Exception as error:  # never a reason for the script not to run
        _say(f"zero-code tracing is off in this process: {type(error).__name__}: {error}")
        return False


def start_from_pth() -> bool:
    """``TRACEML_AUTO`` is set (the ``.pth`` file saw it): start unless it says off."""
    if os.environ.get("TRACEML_AUTO", "").strip().lower() in ("", *_OFF):
        return False
    return start(requested_by="TRACEML_AUTO")
