"""``traceml run``'s end-of-run diagnosis: a child process under a memory budget, started with the job.

The diagnosis runs in a child process under an address-space budget (``TRACEML_DIAGNOSIS_MEMORY_MB``),
so whatever the run folder holds the launcher survives and returns the script's exit code.

Importing the analyzer (numpy, ruptures and the parts of scipy that ruptures loads) is most of a
typical run's diagnosis: about 0.8 s of CPU, which after the job is time the job's machines wait on.
So the child is started when the job starts (:func:`start_diagnosis`): it imports the analyzer on a
thread at nice 10 (on Linux nice is per thread, so the diagnosis itself later runs at the launcher's
priority), then takes its budget and waits on its stdin. When the job has ended the launcher writes
the run folder there (:meth:`DiagnosisProcess.report`); what is left after the job is reading the
run and judging it.

The waiting child is in a session of its own (Ctrl-C in the terminal goes to the job, not to it) and
ends when its stdin closes: a launcher that returns without a report, or dies, takes it along. A child
that is gone by the end (killed, crashed) is replaced by a fresh one, started then, as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.errors import TracemlError
from traceml_otel.settings import TRACEML_DIAGNOSIS_MEMORY_MB, diagnosis_memory_mb

OUT_OF_BUDGET = 3
"""The child's exit code when the diagnosis needed more than its memory budget."""
MAX_REPORT_BYTES = 16 << 20
"""The most of the child's report the launcher reads."""
MAX_REQUEST_BYTES = 1 << 16
"""The most the waiting child reads from its stdin (the run folder and the format)."""
WARM_NICE = 10
"""The niceness of the thread that imports the analyzer while the job runs."""

_CHILD = ("import sys; from traceml_otel.cli.run_diagnosis import diagnose_child; "
          "sys.exit(diagnose_child(sys.argv[1:]))")


@dataclass(frozen=True, slots=True)
class _Finished:
    output: bytes
    returncode: int


class DiagnosisProcess:
    """A diagnosis child started with the job; it waits for the run folder on its stdin."""

    def __init__(self, process: subprocess.Popen[bytes], budget_mb: int) -> None:
        self._process = process
        self.budget_mb = budget_mb

    def report(self, run_dir: Path, html: bool) -> str:
        """The diagnosis of ``run_dir``: from this child when it is still waiting, else from a fresh one."""
        finished = self._hand_over(run_dir, html)
        if finished is None:
            return diagnose_in_child(run_dir, html, self.budget_mb)
        return _text(finished, run_dir, self.budget_mb)

    def _hand_over(self, run_dir: Path, html: bool) -> _Finished | None:
        process = self._process
        if process.poll() is not None or process.stdin is None or process.stdout is None:
            self.close()
            return None
        request = json.dumps({"run_dir": str(run_dir), "html": html}).encode()
        try:
            process.stdin.write(request)
            process.stdin.close()
        except OSError:  # it ended after the poll above
            self.close()
            return None
        output = process.stdout.read(MAX_REPORT_BYTES)
        process.stdout.close()
        returncode = process.wait()
        if returncode < 0 and not output:  # killed while it waited or worked: not its verdict on the run
            return None
        return _Finished(output, returncode)

    def close(self) -> None:
        """End the child if it still waits (no report wanted, or the launcher is leaving): it holds
        nothing but imported modules, so it is killed rather than waited for (it may still be importing)."""
        process = self._process
        for stream in (process.stdin, process.stdout):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass
        if process.poll() is None:
            process.kill()
        process.wait()


def start_diagnosis(budget_mb: int | None = None) -> DiagnosisProcess | None:
    """Start the diagnosis child that imports the analyzer while the job runs; ``None`` if it cannot
    start (the diagnosis is then made by a fresh child at the end)."""
    budget = diagnosis_memory_mb() if budget_mb is None else budget_mb
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, "--wait", str(budget)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return DiagnosisProcess(process, budget)


def diagnose_in_child(run_dir: Path, html: bool, budget_mb: int | None = None) -> str:
    """The diagnosis of ``run_dir`` from a child process started now, under the memory budget."""
    budget = diagnosis_memory_mb() if budget_mb is None else budget_mb
    command = [sys.executable, "-c", _CHILD, "--diagnose", str(run_dir), str(budget)]
    try:
        child = subprocess.run(command + (["--html"] if html else []), stdout=subprocess.PIPE, timeout=None)
    except (OSError, subprocess.SubprocessError) as error:
        return f"traceml: could not diagnose {run_dir}: {type(error).__name__}: {error}"
    return _text(_Finished(child.stdout[:MAX_REPORT_BYTES], child.returncode), run_dir, budget)


def _text(finished: _Finished, run_dir: Path, budget_mb: int) -> str:
    text = finished.output.decode("utf-8", "replace")
    if finished.returncode == OUT_OF_BUDGET:
        return (f"traceml: no diagnosis: it needed more than its memory budget of {budget_mb} MiB "
                f"({TRACEML_DIAGNOSIS_MEMORY_MB}); run `traceml analyze {run_dir}` for it")
    if finished.returncode != 0:
        return text + (f"traceml: could not diagnose {run_dir}: the diagnosis process ended with code "
                       f"{finished.returncode}; run `traceml analyze {run_dir}` for it")
    return text


def diagnose_child(argv: list[str]) -> int:
    """The diagnosis process: ``--diagnose RUN_DIR BUDGET_MB [--html]``, or ``--wait BUDGET_MB`` (import
    the analyzer, then read ``{"run_dir": ..., "html": ...}`` from stdin; nothing there: exit 0). The
    report goes to stdout. The analyzer is imported before the budget, and never by the launcher."""
    if argv[:1] == ["--wait"]:
        budget_mb = int(argv[1])
        _import_analyzer_quietly()
        _take_budget(budget_mb)
        request = sys.stdin.buffer.read(MAX_REQUEST_BYTES)
        if not request:
            return 0  # the launcher wanted no report, or is gone
        asked = json.loads(request)
        run_dir, html = Path(str(asked["run_dir"])), bool(asked["html"])
    else:
        run_dir, budget_mb, html = Path(argv[1]), int(argv[2]), "--html" in argv[3:]
        import traceml_otel.cli.analyze  # noqa: F401  # before the budget; ruptures only if a search runs
        _take_budget(budget_mb)
    from traceml_otel.cli.analyze import diagnose_run_directory

    try:
        text = diagnose_run_directory(run_dir, html=html)
    except MemoryError:
        return OUT_OF_BUDGET
    except (TracemlError, OSError) as error:
        text = f"traceml: could not diagnose {run_dir}: {type(error).__name__}: {error}"
    except Exception as error:  # the launcher survives a bug too; it says it is one
        text = (f"traceml: could not diagnose {run_dir}: internal error (a bug in traceml-otel; please "
                f"report it): {type(error).__name__}: {error}")
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def _import_analyzer() -> None:
    """The analyzer and the libraries its change-point search loads (the waiting child, before its
    memory budget)."""
    import traceml_otel.cli.analyze  # noqa: F401

    try:
        import ruptures  # noqa: F401
    except ImportError:
        pass  # the diagnosis says what is missing when it needs it


def _import_analyzer_quietly() -> None:
    """:func:`_import_analyzer` on a thread at nice :data:`WARM_NICE` (the job is running), with no
    warning printed over the job's output; an error is left for the diagnosis itself to meet."""

    def work() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_NICE)
        except (AttributeError, OSError):
            pass
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _import_analyzer()
        except Exception:  # met again, and reported, by the diagnosis
            pass

    thread = threading.Thread(target=work, name="traceml-diagnosis-import")
    thread.start()
    thread.join()


def _take_budget(budget_mb: int) -> None:
    try:
        import resource

        limit = budget_mb << 20
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard),
                                                hard))
    except (ImportError, ValueError, OSError):
        pass
