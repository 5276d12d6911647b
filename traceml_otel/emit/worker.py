"""The emitter process: one per rank, fed step batches through its stdin pipe.

It turns records into spans and appends them to the local copy as soon as they are read;
OTLP export and metrics get the time the pipe leaves free, so a busy machine delays export,
never the local copy. Each output fails alone: a local copy on a full or read-only disk, a
busy Prometheus port or a broken exporter turns off that output only, says so once on stderr
and in ``rank-R.export.json``, and the others go on.

Priority: the work runs on a thread at ``nice 10`` while the trainer trains. When the trainer
shuts down it writes a byte on a second pipe (``--hurry-fd``; its end of stream, when the trainer
dies, counts too); the main thread, still at nice 0, then takes over, so the rest of the local
copy is written at full priority however busy the CPUs are. The process ignores
SIGINT and SIGTERM, so a Ctrl-C or a launcher's SIGTERM reaches the trainer, whose flush
arrives here; it stops at end of stream, which also comes when the trainer is SIGKILLed.

It reports back on its stdout (a pipe the trainer reads at shutdown) one JSON line once the local
copy is closed, so the trainer states completeness from what was written, not from hope.

This module is the process: priority, signals and the hurry pipe. The outputs are
:mod:`traceml_otel.emit.emitter`'s, the pipe's frames :mod:`traceml_otel.emit.pipe_session`'s.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

from traceml_otel.emit.emitter import REDACT, Emitter, describe
from traceml_otel.emit.pipe_session import PipeSession, read_hello, refuse_stream, report
from traceml_otel.emit.redact import install_log_redaction
from traceml_otel.emit.resource import build_resource
from traceml_otel.wire.control import LocalReport
from traceml_otel.wire.frames import FrameBuffer, WireError
from traceml_otel.wire.hello import WireVersionError

__all__ = ["Emitter", "build_resource", "main", "nice_this_thread"]

EMITTER_NICENESS = 10


def nice_this_thread(niceness: int) -> bool:
    """Lower this thread's priority only (Linux: nice is per thread). False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)
                       + niceness)
    except (OSError, AttributeError):
        return False
    return True



def _hurry_fd(argv: list[str]) -> int | None:
    if "--hurry-fd" in argv[:-1]:
        return int(argv[argv.index("--hurry-fd") + 1])
    return None


def main(argv: list[str] | None = None) -> int:
    """Read frames from stdin until the goodbye or end of stream."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    install_log_redaction(REDACT)  # the SDK logs a malformed OTEL_EXPORTER_OTLP_HEADERS whole
    hurry = threading.Event()
    hurry_fd = _hurry_fd(sys.argv[1:] if argv is None else argv)
    fd = sys.stdin.fileno()
    buffer = FrameBuffer()
    try:
        hello = read_hello(fd, buffer)
    except WireVersionError as error:
        refuse_stream(fd, buffer, error)
        return 1
    except (WireError, ValueError, OSError):
        hello = None
    if hello is None:
        print("traceml: emitter got no settings; exiting", file=sys.stderr)
        return 1
    session = PipeSession(fd, buffer, hello, own_process=True)

    def niced_work() -> None:
        nice_this_thread(EMITTER_NICENESS)  # threads it starts (OTLP, metrics) inherit it
        _guarded(session, hurry)

    if hurry_fd is None or not sys.platform.startswith("linux"):
        try:
            os.nice(EMITTER_NICENESS)  # no per-thread priority: the whole process yields to training
        except OSError:
            pass
        _guarded(session, None)
        return 0
    worker = threading.Thread(target=niced_work, name="traceml-emitter", daemon=True)
    worker.start()
    while worker.is_alive():
        if select.select([hurry_fd], [], [], 0.5)[0]:  # a byte, or the trainer is gone
            hurry.set()
            break
    worker.join()
    if not session.done:
        _guarded(session, None)  # the trainer is shutting down: finish here, at the trainer's priority
    return 0


def _guarded(session: PipeSession, stop: threading.Event | None) -> None:
    """Run the session; a bug of ours is reported with the counts so far, never a silent death."""
    try:
        session.run(stop)
    except Exception as error:
        session.done = True
        print(f"traceml: emitter failed: {describe(error)}", file=sys.stderr, flush=True)
        emitter = session.emitter
        if emitter is not None:
            emitter.stats.problems.append(f"emitter failed: {describe(error)}")
            emitter.stats.end_status = "emitter failed"
            emitter.stats.final = True
            emitter.write_stats()
            report(LocalReport(rank=emitter.stats.rank, enabled=False, steps=emitter.stats.steps_local,
                               complete=False, disabled={"emitter": describe(error)}))


if __name__ == "__main__":
    sys.exit(main())
