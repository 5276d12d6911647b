"""How a training session ends: the last step, the emitter's goodbye, and what the trainer says at exit.

The emitter's report on the local copy (``link.local_report``) is read in :func:`local_copy_sentence`
alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from traceml_otel.settings import linger_budget_s
from traceml_otel.warn_line import warn
from traceml_otel.wire.control import LocalReport

if TYPE_CHECKING:
    from traceml_otel.capture.emitter_link import EmitterLink, Finishable
    from traceml_otel.capture.inferred_steps import InferredSteps
    from traceml_otel.capture.recorder import StepRecorder
    from traceml_otel.capture.time_ledger import TimeLedger
    from traceml_otel.settings import Settings


class ClosingSession(Protocol):
    """What closing needs of the training session (``capture/session.py``'s ``TrainingSession``)."""

    settings: Settings
    link: EmitterLink
    manifest: Finishable | None
    recorder: StepRecorder
    time_ledger: TimeLedger
    watchdog: Any
    inferred: InferredSteps | None
    installed: list[Any]
    internal_errors: int
    profiler_capture: Any

    def end_step(self, exception_type: str | None) -> None:
        """Close the open step."""


def close_session(session: ClosingSession, status: str) -> None:
    """Close the open step, hand everything over, say goodbye to the emitter (bounded by
    ``TRACEML_SHUTDOWN_TIMEOUT_S``), undo the hooks and say at exit what was lost."""
    settings, link, recorder = session.settings, session.link, session.recorder
    if session.time_ledger is not None:  # from here to the final record: telemetry's own time
        session.time_ledger.telemetry_began()
    if session.watchdog is not None:
        session.watchdog.stop(clean=status == "ok")
    try:
        if session.inferred is not None:  # an inferred step still open at exit is no completed update
            session.inferred.stop()
        if recorder.in_step:
            session.end_step("Interrupted")  # a running deep capture's end_step, if one runs
        from traceml_otel.capture.capture_start import close_profiler_capture

        close_profiler_capture(getattr(session, "profiler_capture", None), settings.shutdown_timeout_s)
        recorder.flush(wait_s=2.0)
        link.dropped_steps += recorder.unresolved_steps
        session.time_ledger.write()  # the emitter's live time counters read the last blocks at its end
        # The scrape endpoint stays up after the end until every scraper saw the end marker.
        finished = link.close(
            settings.shutdown_timeout_s + linger_budget_s(settings.prometheus_linger_s), status,
            traced=recorder.step, stall_s=settings.emitter_stall_s,
        )
        if link.local_report is None:
            record_handoff(session, status)
        session.time_ledger.write(ended=True)
        if session.manifest is not None:
            session.manifest.finish(status)
    except Exception as error:
        warn(f"telemetry shutdown failed: {type(error).__name__}: {error}")
        return
    for hook in reversed(session.installed):  # last installed first: patches of one attribute nest
        hook.uninstall()
    _say_what_was_lost(session, finished)


def _say_what_was_lost(session: ClosingSession, finished: bool) -> None:
    link, recorder = session.link, session.recorder
    if link.dropped_steps:
        reason = link.broken or "backlog full or device work unfinished"
        warn(f"{link.dropped_steps} step(s) could not be handed to the emitter and are "
             f"missing from telemetry ({reason})")
    if session.internal_errors:
        warn(f"{session.internal_errors} internal instrumentation error(s) were ignored")
    if recorder.other_thread_steps:
        warn(f"{recorder.other_thread_steps} trace_step() block(s) and "
             f"{recorder.other_thread_phases} phase call(s) on threads other than the training "
             "thread were ignored (one training thread per process)")
    handed = link.steps_offered - link.dropped_steps
    local = local_copy_sentence(link.local_report, recorder.step, session.settings.run_dir,
                                handed, link.emitter_fate())
    if local:
        warn(local)
    if not finished and link.local_report is not None:
        warn("the emitter was still exporting over OTLP at the shutdown deadline; it finishes in the "
             "background")


def record_handoff(session: ClosingSession, status: str) -> None:
    """The emitter did not report back: write what was handed to it, for the account and diagnosis."""
    settings, link = session.settings, session.link
    run_dir = settings.run_dir
    if run_dir is None:
        return
    from traceml_otel.wire.handoff import Handoff, write_handoff

    handoff = Handoff(
        run_id=settings.run_id, rank=settings.identity.rank, steps_traced=session.recorder.step,
        steps_handed=link.steps_handed, steps_dropped=link.dropped_steps,
        emitter=link.emitter_fate(), end_status=status,
    )
    try:
        write_handoff(Path(run_dir), handoff)
    except OSError as error:
        warn(f"cannot record the handoff in {run_dir}: {error.strerror or error}")


def local_copy_sentence(
    report: LocalReport | None, traced: int, run_dir: Any, handed: int | None = None,
    fate: str = "exited",
) -> str | None:
    """What the trainer says about the local copy at exit, from the emitter's own count only."""
    if run_dir is None:
        return None
    if report is None:
        handed_text = "" if handed is None else f"; {handed} of them were handed to it"
        return (f"the telemetry process {fate} before reporting on the local copy, so it may be missing any "
                f"of the {traced} traced steps{handed_text} (the account and rank-R.export.json say how many "
                "it wrote)")
    if not report.enabled:
        return f"the local copy was turned off ({report.disabled}); it holds {report.steps} of {traced} steps"
    if report.steps != traced:
        return f"the local copy holds {report.steps} of {traced} steps"
    return None
