"""Where the start-up hook of zero-code tracing lives, and how a launch turns it on.

``traceml run`` runs each rank as ``python -u script.py``, exactly as ``torchrun`` does, with
:data:`BOOTSTRAP_DIR` first on ``PYTHONPATH``: Python then imports its ``sitecustomize`` at start-up,
in every rank, whatever launched it, before the script's first line and without changing the script,
its ``sys.argv``, ``__main__`` or ``sys.path[0]`` (running the script through a wrapper module with
``runpy`` would change all of them, and pickling of classes defined in the script with them). The hook
chains to an existing ``sitecustomize`` and attaches only in the process running the script.

For a direct launch (``torchrun``, ``accelerate launch``, ``python``) the same hook is turned on with

    PYTHONPATH="$(python -m traceml_otel.launch.bootstrap)${PYTHONPATH:+:$PYTHONPATH}" torchrun ... train.py
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from traceml_otel.settings import TRACEML_AUTO_ATTACH, TRACEML_BOOT_SCRIPT, auto_attach_requested

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_boot"
"""The folder holding the start-up hook (``sitecustomize.py``)."""


def auto_attach_env(env: Mapping[str, str], script: str) -> dict[str, str]:
    """The variables that turn zero-code tracing on for the ranks of ``script`` (over ``env``).

    Nothing when ``TRACEML_AUTO_ATTACH=0`` is already set (the user's opt-out wins).
    """
    if not auto_attach_requested(env)[0]:
        return {}
    path = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, TRACEML_AUTO_ATTACH: "1", TRACEML_BOOT_SCRIPT: str(Path(script).resolve())}


if __name__ == "__main__":
    print(BOOTSTRAP_DIR)
