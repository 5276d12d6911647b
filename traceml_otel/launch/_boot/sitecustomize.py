"""traceml-otel's start-up hook for scripts that never import traceml (zero-code tracing).

``traceml run`` puts this folder first on ``PYTHONPATH``, so every Python process it starts imports
this module at start-up (before the script). It starts zero-code tracing in the training processes
only (:func:`traceml_otel.integrations.startup.start`, which filters on ``os`` and ``sys`` first), then
steps aside: it takes its folder off ``sys.path`` and imports the ``sitecustomize`` that would have
run without it, if there is one. It imports neither torch nor any framework.
"""

import os
import sys


def _start() -> None:
    try:
        from traceml_otel.integrations.startup import start

        start()
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
