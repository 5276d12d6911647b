"""One local process without the elastic agent: what ``traceml run`` does for ``--nproc-per-node 1``.

``torch.distributed.run`` would import torch in the launcher and start an elastic agent and a
rendezvous before the script even begins (about 2.5 s on the development machine, on top of the
script's own start-up). For one process on one node none of that is needed. The script gets the
environment ``python train.py`` would give it: none of torchrun's variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ...), so Trainer, Accelerate and Lightning do not wrap the model
for a one-process "distributed" job; a script that calls ``init_process_group`` itself fails as under
``python``. It runs in its own session as under torchrun, and SIGINT, SIGTERM,
SIGHUP and SIGQUIT are forwarded to it (a child still running 30 s later is killed). Exit codes
follow torchrun's: the script's, or 128 + the signal number.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
KILL_AFTER_S = 30.0
"""After a forwarded signal, how long the script has to exit before it is killed."""


WAIT_TICK_S = 1.0
"""How often the waiting launcher looks at forwarded signals (the 30 s kill deadline's resolution)."""


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        return None


def _exit_within(child: subprocess.Popen[bytes], pidfd: int | None, timeout_s: float) -> int | None:
    """The child's exit code if it exits within ``timeout_s``, else None.

    With a pidfd the launcher sleeps in ``select`` until the child exits (or the tick ends): one
    wake-up a second. ``Popen.wait(timeout)``, the fallback, polls with 0.5-50 ms sleeps, about 55
    wake-ups a second: ~6 ms of CPU a second on the development VM, all of a run long.
    """
    if pidfd is None:
        try:
            return child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
    select.select([pidfd], [], [], timeout_s)  # a handled signal runs its handler; select resumes
    return child.poll()


TORCHRUN_VARIABLES = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "NODE_RANK",
)
"""What torchrun gives a rank, and what makes Trainer, Accelerate and Lightning believe they are
distributed: none of it reaches a one-process script."""


def single_process_env(env: Mapping[str, str]) -> dict[str, str]:
    """The script's environment: ``env`` without torchrun's variables, as ``python train.py`` sees it
    (telemetry's rank identity comes from traceml's own variables, and defaults to rank 0 of 1)."""
    return {name: value for name, value in env.items() if name not in TORCHRUN_VARIABLES}


def single_process_command(script: str, script_args: Sequence[str], module: bool = False) -> list[str]:
    """``python -u script args`` (``python -u -m module args``), as torchrun runs each rank."""
    return [sys.executable, "-u", *(["-m"] if module else []), script, *script_args]


def run_single_process(
    script: str, script_args: Sequence[str], env: Mapping[str, str], run_id: str, module: bool = False
) -> int:
    """Run the script as rank 0 of 1 and return a shell-style exit code."""
    command = single_process_command(script, script_args, module)
    received: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        try:
            if started:
                started[0].send_signal(signum)
        except ProcessLookupError:
            pass

    # The handlers go in before the child starts: an ignored SIGINT (a launcher started in the
    # background from a script) would be inherited, and the child's Python would install no Ctrl-C
    # handler, so a forwarded SIGINT would do nothing. A handled signal is reset to the default at exec.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        child = subprocess.Popen(command, env=single_process_env(env), start_new_session=True)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    started.append(child)
    if received:  # a signal came while the child was starting
        forward(received.pop(), None)
    pidfd = _pidfd(child.pid)
    try:
        deadline = None
        while True:
            code = _exit_within(child, pidfd, WAIT_TICK_S)
            if code is not None:
                break
            if received and deadline is None:
                deadline = time.monotonic() + KILL_AFTER_S
            if deadline is not None and time.monotonic() > deadline:
                child.kill()
    finally:
        if pidfd is not None:
            os.close(pidfd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        return 128 + received[0]
    return 128 - code if code < 0 else code
