"""The launcher's view of its ranks' ends: which rank failed first, and how.

A rank killed by the OS (SIGKILL, the OOM killer) says nothing: its telemetry stops mid-step. The
ranks it leaves behind fail in their next collective (a gloo/NCCL error) or are stopped by the elastic
agent (SIGTERM). Their own records then blame themselves. Only the parent sees every child's exit, so
the launcher names the first failure:

- under ``torch.distributed.run`` (in this process) the elastic agent's process context
  (``SubprocessContext``) polls its workers and records each one that exited non-zero as a
  ``ProcessFailure`` (exit code; negative for a signal). When it finds a failure it terminates the
  others (``close()``); :func:`watch_torchrun_failures` reads the failures it found *before* that
  close, so the ranks it stops afterwards are consequences, not causes;
- a single process: its exit status (``Popen.returncode``), which also sees a top-level
  ``raise SystemExit(n)`` that the process cannot see from inside.

The first failure goes into ``manifest.json`` (``first_failure_rank``, ``first_failure``) at once,
before the survivors are stopped: their emitters, still lingering for the last scrape, read it and
export ``traceml_run_first_failure`` (emit/step_metrics.py), which names the rank in TraceMLJobFailed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

INTERRUPTS = frozenset({signal.SIGTERM, signal.SIGINT})
"""A rank that ended of these was stopped (by the agent, a cancel), not failed of itself."""


@dataclass(frozen=True, slots=True)
class FirstFailure:
    """The rank that failed first, as its parent saw it."""

    rank: int
    how: str
    """``SIGKILL`` (killed by a signal) or ``exit code N``."""
    exit_code: int
    """Shell-style: 128 + the signal number for a signal."""


def describe_exit(returncode: int) -> str:
    """``SIGKILL`` for a child killed by a signal (negative ``returncode``), else ``exit code N``."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def first_failure_of(failures: Mapping[int, Any], rank_offset: int = 0) -> FirstFailure | None:
    """The first failure among torch's ``ProcessFailure`` records (keyed by local rank).

    Earliest first (``timestamp``: whole seconds, so ties are common); on a tie a rank killed by a
    signal other than SIGTERM/SIGINT comes first (its peers' collective errors follow from it), then
    the lowest rank. A SIGTERM/SIGINT alone is a stop from outside: no first failure.
    """
    def key(item: tuple[int, Any]) -> tuple[int, int, int]:
        local_rank, failure = item
        code = int(failure.exitcode)
        return int(getattr(failure, "timestamp", 0) or 0), 0 if code < 0 else 1, local_rank

    candidates = [(r, f) for r, f in failures.items()
                  if int(f.exitcode) != 0 and -int(f.exitcode) not in {int(s) for s in INTERRUPTS}]
    if not candidates:
        return None
    local_rank, failure = min(candidates, key=key)
    code = int(failure.exitcode)
    return FirstFailure(rank_offset + int(local_rank), describe_exit(code), 128 - code if code < 0 else code)


@contextlib.contextmanager
def watch_torchrun_failures(
    on_failure: Callable[[FirstFailure], None], rank_offset: int = 0
) -> Iterator[None]:
    """While in the block, call ``on_failure`` once per attempt with the first failure the elastic
    agent's process context found, before it stops the remaining ranks (torch's
    ``SubprocessContext.close``). ``rank_offset``: this node's first global rank (static rendezvous:
    ``node_rank * nproc_per_node``). Never raises into the agent."""
    try:
        from torch.distributed.elastic.multiprocessing.api import SubprocessContext
    except ImportError:  # no torch: nothing to watch
        yield
        return
    own = "close" in SubprocessContext.__dict__
    original = SubprocessContext.close
    lock = threading.Lock()

    def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            try:
                found = first_failure_of(dict(getattr(self, "_failures", {}) or {}), rank_offset)
                if found is not None:
                    on_failure(found)
            except Exception:  # the agent must stop its workers whatever happened here
                pass
        return original(self, *args, **kwargs)

    SubprocessContext.close = close
    try:
        yield
    finally:
        if own:
            SubprocessContext.close = original
        else:
            del SubprocessContext.close
