"""What ties a training session to its process: exit, SIGTERM, uncaught exceptions, fork, the launcher.

:func:`install` runs once, when ``init()`` started a session. Each hook ends the process's session
(:func:`traceml_otel.capture.session.take`) at most once, whoever comes first.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from types import TracebackType
from typing import Any, NoReturn

from traceml_otel.capture import session as sessions
from traceml_otel.warn_line import warn

_exit_status = "ok"
"""How the program is ending, for the emitter's ``end_status``: an uncaught exception or Ctrl-C."""


def exit_status() -> str:
    """``ok``, ``SIGINT (Ctrl-C)`` or ``exception <Type>`` (an uncaught exception seen so far)."""
    return _exit_status


def end_session(status: str | None = None) -> None:
    """End the process's session (``shutdown()``, at exit): ``status`` defaults to :func:`exit_status`."""
    sessions.take().shutdown(status=_exit_status if status is None else status)


def install() -> None:
    """Flush at exit and on SIGTERM, name an uncaught exception, forget the session in forked
    children, and stop with the launcher."""
    atexit.register(end_session)
    os.register_at_fork(after_in_child=_forget_in_child)
    _install_os_exit_flush()
    _install_sigterm_flush()
    _install_exit_status_hook()
    _install_exit_code_hook()
    _stop_with_launcher()


def _forget_in_child() -> None:
    """After fork (DataLoader workers): the child must not write to the parent's pipe."""
    sessions.take().forget_in_child()


def _install_os_exit_flush() -> None:
    """``os._exit()`` skips ``atexit``: end the session first, then exit as asked.

    Scripts call it to skip a teardown that hangs (a process group's destruction) or in a worker
    process. Without this, the steps not yet handed to the emitter (up to 256 steps or 250 ms) were
    lost. Code 0 ends the session as a clean exit does (``ok``), another code as ``os._exit(N)``;
    bounded by ``TRACEML_SHUTDOWN_TIMEOUT_S``, as at exit. In a forked child (a DataLoader worker,
    a ``multiprocessing`` process) the session is already forgotten, and this costs nothing.
    """
    original = os._exit
    if hasattr(original, "__traceml_original__"):
        return

    def traceml_flush_then_exit(code: int) -> NoReturn:
        try:
            end_session("ok" if code == 0 else f"os._exit({code})")
        except BaseException:  # exiting is what was asked, whatever happened here
            pass
        original(code)

    traceml_flush_then_exit.__traceml_original__ = original  # type: ignore[attr-defined]
    os._exit = traceml_flush_then_exit


def _install_sigterm_flush() -> None:
    """On SIGTERM, the script's own handler first and at once; telemetry ends only with the process.

    - A handler the script installed before ``init()`` runs immediately, before anything of ours: the
      grace period (Kubernetes, Slurm, torchrun) is the script's, and a blackholed OTLP endpoint must
      not eat it. The session stays open, so the steps the script still runs (it finishes its step,
      saves, exits) are traced, handed over by the usual batches and flushed at exit, bounded by
      ``TRACEML_SHUTDOWN_TIMEOUT_S``.
    - An ignored SIGTERM stays ignored: nothing ends.
    - With the default action, the completed steps are flushed (bounded by
      ``TRACEML_SHUTDOWN_TIMEOUT_S``) and the process then dies of the signal as it would have.
    - A handler installed after ``init()`` replaces ours; if it chains to us (as frameworks do to
      the handler they found), we do what the default action's absence would: nothing, so the
      script's handler decides, as without traceml.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    flushing = False

    def on_sigterm(signum: int, frame: Any) -> None:
        nonlocal flushing
        if callable(previous):
            previous(signum, frame)  # the script's handler, before anything of ours
            return
        if previous == signal.SIG_IGN or signal.getsignal(signal.SIGTERM) is not on_sigterm:
            return  # ignored, or chained to by a later handler that decides what happens
        # A repeated SIGTERM must not cut the first one's flush short: Python runs a handler again
        # inside a running one, and the kernel sends the parent-death signal once per exiting thread
        # of a SIGKILLed launcher. The first call ends the process when its flush is done.
        if flushing:
            return
        flushing = True
        try:
            end_session("SIGTERM")  # bounded by TRACEML_SHUTDOWN_TIMEOUT_S
        finally:
            flushing = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


def _install_exit_status_hook() -> None:
    """Record an uncaught exception (Ctrl-C included) so the exit-time flush names it, not "ok"."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        global _exit_status
        interrupted = issubclass(kind, KeyboardInterrupt)
        _exit_status = "SIGINT (Ctrl-C)" if interrupted else f"exception {kind.__name__}"
        previous(kind, value, tb)

    sys.excepthook = hook


def _install_exit_code_hook() -> None:
    """``sys.exit(1)`` (and ``exit()``/``quit()``) raise ``SystemExit``, which never reaches
    ``sys.excepthook``: record a non-zero code so the exit-time flush says ``exit N``, not ``ok``.
    A ``raise SystemExit(n)`` written out in the script is not seen (``traceml run``'s manifest has
    the process's exit code)."""
    import builtins

    original = sys.exit
    if hasattr(original, "__traceml_original__"):
        return

    def record(code: object) -> None:
        global _exit_status
        number = 0 if code is None else code if isinstance(code, int) else 1
        if number != 0 and _exit_status == "ok":
            _exit_status = f"exit {number}"

    def traceml_exit(code: object = None) -> NoReturn:
        record(code)
        original(code)  # type: ignore[arg-type]

    traceml_exit.__traceml_original__ = original  # type: ignore[attr-defined]
    sys.exit = traceml_exit
    for name in ("exit", "quit"):
        quitter = getattr(builtins, name, None)
        if quitter is None or hasattr(quitter, "__traceml_original__"):
            continue

        def traceml_quit(code: object = None, _quitter: Any = quitter) -> NoReturn:
            record(code)
            _quitter(code)
            raise SystemExit(code)  # not reached: the quitter raises

        traceml_quit.__traceml_original__ = quitter  # type: ignore[attr-defined]
        setattr(builtins, name, traceml_quit)


def _stop_with_launcher() -> None:
    try:
        from traceml_otel.capture.orphan import stop_with_launcher

        stop_with_launcher()
    except Exception as error:  # never a reason not to train
        warn(f"cannot arrange to stop with the launcher: {type(error).__name__}: {error}")
