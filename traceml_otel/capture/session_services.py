"""A training session's background services: the hang watchdog and the time ledger."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceml_otel.capture.precision import AutocastWatch
    from traceml_otel.capture.recorder import StepRecorder
    from traceml_otel.capture.time_ledger import TimeLedger
    from traceml_otel.capture.watchdog import HangWatchdog
    from traceml_otel.settings import Settings


def start_time_ledger(recorder: StepRecorder, settings: Settings, warn: Callable[[str], None]) -> TimeLedger:
    """This rank's time record (``rank-R.time.json``), written now with the process start."""
    from traceml_otel.capture.time_ledger import TimeLedger, own_start_time, process_start_time, restart_count

    ledger = TimeLedger(
        settings.run_dir, settings.identity.rank, settings.run_id, lambda: recorder.step,
        peak_flops=settings.peak_flops, dtype=settings.mfu_dtype, warn=warn,
    )
    ledger.restart = restart_count()
    if settings.launcher in ("torchrun", "accelerate launch"):  # start-up counts from the agent's start
        # Its own start, not a parent shell's; after a restart the agent has waited for the failed
        # ranks and runs since the first attempt: its /proc start then.
        agent = os.getppid()
        ledger.launcher_start = own_start_time(agent) if not ledger.restart else process_start_time(agent)
    if ledger.restart > 0:
        ledger.carry_earlier_attempt()
        recorder.step = ledger.first_step  # go on numbering: the earlier attempts' spans keep their ids
    ledger.write()
    ledger.start_writer()
    return ledger


def watch_autocast(ledger: TimeLedger) -> AutocastWatch:
    """Tell the ledger when the program first enters an enabled ``torch.autocast`` region."""
    from traceml_otel.capture.precision import AutocastWatch

    watch = AutocastWatch(ledger.note_precision)
    watch.install()
    return watch


def start_watchdog(
    recorder: StepRecorder, collectives: Any, settings: Settings, warn: Callable[[str], None]
) -> HangWatchdog | None:
    """This rank's hang watchdog (:mod:`traceml_otel.capture.watchdog`); ``None`` when turned off."""
    if settings.hang_timeout_s <= 0:
        return None
    from traceml_otel.capture.watchdog import HangWatchdog

    identity = settings.identity
    try:
        watchdog = HangWatchdog(
            recorder, getattr(collectives, "progress", None), rank=identity.rank,
            world_size=identity.world_size, run_id=settings.run_id, host=identity.host,
            run_dir=settings.run_dir, floor_s=settings.hang_timeout_s, factor=settings.hang_factor,
            startup_timeout_s=settings.hang_startup_timeout_s,
            announce=settings.launcher != "traceml run", warn=warn,
        )
        watchdog.start()
    except Exception as error:  # never a reason not to train
        warn(f"the hang watchdog is off for this run: {type(error).__name__}: {error}")
        return None
    return watchdog


