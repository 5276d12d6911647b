"""traceml-otel's start-up hook for scripts that never import traceml (zero-code tracing).

``traceml run`` puts this folder first on ``PYTHONPATH``, so every Python process it starts imports
this module at start-up (before the script). It installs the lazy import hooks of
:mod:`traceml_otel.integrations.auto_attach` in the training processes only, then steps aside: it
takes its folder off ``sys.path`` and imports the ``sitecustomize`` that would have run without it,
if there is one. It imports neither torch nor any framework.
"""

import os
import sys


def _may_attach() -> bool:
    """A first filter on ``os`` and ``sys`` alone, so that processes that will not attach (DataLoader
    workers, the emitter, programs the script starts) do not even import traceml_otel: the opt-out,
    ``python -c``, and under ``traceml run`` a command line that does not name its script.
    :func:`traceml_otel.integrations.auto_attach.is_training_process` decides exactly."""
    if os.environ.get("TRACEML_AUTO_ATTACH", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    argv = getattr(sys, "orig_argv", None) or []
    if "-c" in argv[1:3]:
        return False
    script = os.environ.get("TRACEML_BOOT_SCRIPT")
    return not script or any(os.path.basename(arg) == os.path.basename(script) for arg in argv[1:])


def _start() -> None:
    if not _may_attach():
        return
    try:
        from traceml_otel.integrations import auto_attach

        auto_attach.start_in_process()
    except Exception as error:  # never a reason for the script not to run
        print(f"traceml: zero-code tracing is off in this process: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)


def _chain_to_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the environment's own, now that ours is off the path
    except ModuleNotFoundError as error:
        if error.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_start()
_chain_to_next_sitecustomize()
