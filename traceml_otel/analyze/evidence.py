"""What the data can and cannot support: missing or partial ranks, and how a failed run failed.

These are findings about the run itself, shown above the step-time verdict so that a verdict
drawn from one rank of two, or from a run that crashed, says so.

- ``MISSING_RANKS``: the world size (from the step spans, else the manifest) names ranks that
  sent no step at all.
- ``PARTIAL_RANKS``: a rank recorded fewer than 95 % (and at least 2 fewer) of the steps of the
  rank that recorded most; only steps every rank completed are analysed.
- ``RUN_FAILED``: a traced step raised (rank, step and exception type are named), or the
  manifest records a non-zero exit code. When the job's exit code says a rank crashed on a signal
  (SIGABRT, SIGSEGV, ...: gloo aborts a rank this way on a collective mismatch) and a rank's
  emitter saw its trainer end without shutting down, that rank is named first, and a rank that
  then raised in a step (its collective lost the peer) is named as a likely consequence; unless that
  failed step moved more collective calls or bytes than any completed step of its rank (an extra
  call: gloo aborts the receiver of the larger message), which is then named as the mismatch.
- ``RUN_INTERRUPTED`` instead, when the end was Ctrl-C or SIGTERM (a ``KeyboardInterrupt`` in a
  step, a step cut short by the signal, or exit code 130 or 143): a warning, the step still named.
- ``TELEMETRY_DEGRADED``: the emitters' export statistics (``rank-R.export.json``, in a run
  directory) name an output turned off, an incomplete local copy, or data OTLP did not deliver
  (see :mod:`traceml_otel.analyze.telemetry_health`).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence

from traceml_otel.analyze import thresholds as t
from traceml_otel.analyze.findings import Evidence, Finding, RankCount, StepFailure
from traceml_otel.analyze.kinds import SEVERITY_ORDER, RunKind, Severity
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.telemetry_health import telemetry_finding
from traceml_otel.wire.export_stats import ExportStats

MAX_FAILURES = 20
"""Failed steps listed in the report (the first per rank come first)."""
MAX_LISTED_RANKS = 64
"""Missing ranks named in the report; more are counted."""
CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})
"""Signals a rank dies of by itself (a native crash or abort), unlike a scheduler's SIGTERM or SIGKILL."""
NO_SHUTDOWN = "trainer exited without shutdown"


def missing_ranks(world_size: int | None, observed: Sequence[int]) -> tuple[int, ...]:
    """The first :data:`MAX_LISTED_RANKS` ranks in ``range(world_size)`` that sent no step.

    Bounded: the world size comes from span data, and a hostile or corrupt ``1e19`` must not
    make the analyzer list (or allocate) that many ranks.
    """
    if not world_size or world_size < 0:
        return ()
    seen = set(observed)
    absent: list[int] = []
    rank = 0
    while rank < world_size and len(absent) < MAX_LISTED_RANKS:
        if rank not in seen:
            absent.append(rank)
        rank += 1
    return tuple(absent)


def missing_rank_count(world_size: int | None, observed: Sequence[int]) -> int:
    """How many ranks of ``range(world_size)`` sent no step (all of them, not only the listed)."""
    if not world_size or world_size < 0:
        return 0
    return world_size - len({rank for rank in observed if 0 <= rank < world_size})


def rank_counts(steps: Sequence[StepTiming]) -> tuple[RankCount, ...]:
    """Steps, first and last step number per rank (failed steps included)."""
    counts: dict[int, list[int]] = {}
    for step in steps:
        entry = counts.get(step.rank)
        if entry is None:
            counts[step.rank] = [1, step.step, step.step]
        else:
            entry[0] += 1
            entry[1] = min(entry[1], step.step)
            entry[2] = max(entry[2], step.step)
    return tuple(RankCount(rank, *entry) for rank, entry in sorted(counts.items()))


def partial_ranks(counts: Sequence[RankCount]) -> tuple[RankCount, ...]:
    """Ranks that recorded clearly fewer steps than the fullest rank."""
    if len(counts) < 2:
        return ()
    most = max(c.steps for c in counts)
    return tuple(
        c for c in counts if c.steps < t.PARTIAL_FRACTION * most and most - c.steps >= t.PARTIAL_MIN_GAP
    )


def step_failures(steps: Sequence[StepTiming]) -> tuple[StepFailure, ...]:
    """Steps that raised: the first of each rank, then the others, in step order."""
    failed = sorted((s.step, s.rank, s.error or "error") for s in steps if s.error is not None)
    first: dict[int, StepFailure] = {}
    rest: list[StepFailure] = []
    for step, rank, error in failed:
        failure = StepFailure(rank, step, error)
        if rank in first:
            rest.append(failure)
        else:
            first[rank] = failure
    return (*first.values(), *rest)[:MAX_FAILURES]


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def run_findings(
    *,
    world_size: int | None,
    counts: Sequence[RankCount],
    failures: Sequence[StepFailure],
    failed_steps: int,
    exit_code: int | None,
    export_stats: Sequence[ExportStats] = (),
    steps: Sequence[StepTiming] = (),
    first_failure: tuple[int, str] | None = None,
) -> tuple[Finding, ...]:
    """The findings about the data itself, most serious first (``steps``: every step, failed ones
    included, to spot a failed step with an extra collective; ``first_failure``: the rank that failed
    first and how, as ``traceml run`` saw its children in the manifest)."""
    findings: list[Finding] = []
    observed = [c.rank for c in counts]
    absent = missing_ranks(world_size, observed)
    unlisted = missing_rank_count(world_size, observed) - len(absent)
    more = f" and {unlisted} more" if unlisted > 0 else ""
    if absent:
        findings.append(Finding(
            kind=RunKind.MISSING_RANKS,
            severity=Severity.WARNING,
            score=None,
            title=f"{_ranks_text(absent)}{more} sent no telemetry",
            why=(f"World size {world_size}, ranks seen {observed or '[]'}: {_ranks_text(absent)}{more} "
                 + ("recorded no step, so the verdict is drawn from the other ranks only and cannot see a "
                    "straggler among the missing." if observed else
                    "recorded no step: no rank sent any, so there is no verdict on the steps.")),
            next=("Check that every rank calls traceml.init() and trace_step(), that its process did not "
                  "die early, and that its rank-<R>.traces.jsonl (or its spans in the backend) exist."),
            evidence=(Evidence("world_size", world_size), Evidence("ranks_seen", str(observed)),
                      Evidence("missing_ranks", str(list(absent)))),
        ))
    short = partial_ranks(counts)
    if short:
        most = max(c.steps for c in counts)
        detail = "; ".join(f"rank {c.rank} {c.steps} steps ({c.first_step}-{c.last_step})" for c in short)
        findings.append(Finding(
            kind=RunKind.PARTIAL_RANKS,
            severity=Severity.WARNING,
            score=None,
            title=f"{_ranks_text([c.rank for c in short])} recorded fewer steps",
            why=(f"{detail}, against {most} on the fullest rank. Only the steps every rank completed are "
                 "analysed."),
            next="Look at why the rank stopped early (its log, a crash, a kill) or lost telemetry "
                 "(its export report).",
            evidence=tuple(Evidence(f"rank_{c.rank}_steps", c.steps) for c in short),
        ))
    outside = raised_outside_steps(export_stats, failures) or crashed_ranks(export_stats, failures, exit_code)
    if first_failure is not None and first_failure[1].startswith("SIG"):  # killed: its peers' errors follow
        outside = ((first_failure[0], first_failure[1]), *(o for o in outside if o[0] != first_failure[0]))
    if failures or outside or (exit_code not in (None, 0)):
        interrupt = None if outside else _interrupt(failures, exit_code)
        findings.append(_interrupted(interrupt, failures, exit_code, counts) if interrupt
                        else _failed(failures, failed_steps, exit_code, counts, outside,
                                     extra_collective(steps, failures)))
    degraded = telemetry_finding(export_stats)
    if degraded is not None:
        findings.append(degraded)
    findings.sort(key=lambda f: -SEVERITY_ORDER[f.severity])  # stable: the order above within a severity
    return tuple(findings)


def launcher_first_failure(manifest: object) -> tuple[int, str] | None:
    """(rank, how) of the first failure ``traceml run`` recorded in the manifest, else ``None``."""
    rank = getattr(manifest, "first_failure_rank", None)
    return None if rank is None else (rank, getattr(manifest, "first_failure", None) or "")


def raised_outside_steps(
    export_stats: Sequence[ExportStats], failures: Sequence[StepFailure]
) -> tuple[tuple[int, str], ...]:
    """(rank, exception type) of ranks whose process ended on an uncaught exception that no traced
    step of theirs raised (a DataLoader error, set-up, evaluation), from ``rank-R.export.json``."""
    in_step = {failure.rank for failure in failures}
    found = []
    for stats in export_stats:
        kind = stats.end_status.removeprefix("exception ")
        raised = kind != stats.end_status and kind and kind not in INTERRUPT_EXCEPTIONS
        if raised and stats.rank not in in_step:
            found.append((stats.rank, kind))
    return tuple(sorted(found))


INTERRUPT_EXCEPTIONS = {"KeyboardInterrupt": "Ctrl-C", "Interrupted": "a signal"}
"""Exception types of a step the stop cut short (``Interrupted``: the step was open at SIGTERM)."""
INTERRUPT_EXIT_CODES = {130: "Ctrl-C (SIGINT)", 143: "SIGTERM", -2: "Ctrl-C (SIGINT)", -15: "SIGTERM"}


def crashed_ranks(
    export_stats: Sequence[ExportStats], failures: Sequence[StepFailure], exit_code: int | None
) -> tuple[tuple[int, str], ...]:
    """(rank, signal name) of ranks that crashed: the job's exit code is a crash signal's
    (``128 + SIGABRT``, ...) and the rank's emitter saw its trainer end without shutting down (no
    exception, no signal handler: a native abort) while raising in no step of its own.

    The first to end comes first (its emitter closed its local copy first): when the launcher then
    kills the other ranks and one of them cannot run its shutdown in time (blocked in a collective),
    it ends without shutting down too, seconds later, and is not the crash."""
    if exit_code is None or exit_code <= 128 or exit_code - 128 not in {int(s) for s in CRASH_SIGNALS}:
        return ()
    name = signal.Signals(exit_code - 128).name
    in_step = {failure.rank for failure in failures}
    crashed = [stats for stats in export_stats
               if stats.end_status.startswith(NO_SHUTDOWN) and stats.rank not in in_step]
    crashed.sort(key=lambda stats: (
        stats.local_copy_closed_unix if stats.local_copy_closed_unix is not None else math.inf, stats.rank))
    return tuple((stats.rank, name) for stats in crashed)


def extra_collective(steps: Sequence[StepTiming], failures: Sequence[StepFailure]) -> StepFailure | None:
    """The first failed step that moved more collective calls or bytes than every completed step of
    its rank (one extra or larger call: one side of a collective mismatch); ``None`` when none did."""
    failed = {(f.rank, f.step): f for f in failures[:MAX_FAILURES]}
    most: dict[int, tuple[int, int]] = {}
    candidates: list[tuple[StepFailure, int, int]] = []
    for step in steps:
        calls, nbytes = step.comm_calls or 0, step.comm_bytes or 0
        if step.error is None:
            known = most.get(step.rank, (0, 0))
            most[step.rank] = (max(known[0], calls), max(known[1], nbytes))
        elif (step.rank, step.step) in failed and calls:
            candidates.append((failed[(step.rank, step.step)], calls, nbytes))
    for failure, calls, nbytes in candidates:
        usual = most.get(failure.rank)
        if usual is not None and usual[0] and (calls > usual[0] or nbytes > usual[1]):
            return failure
    return None


def _interrupt(failures: Sequence[StepFailure], exit_code: int | None) -> str | None:
    """How the run was stopped, when it was stopped rather than failed; ``None`` otherwise."""
    if exit_code in INTERRUPT_EXIT_CODES:
        if all(f.exception_type in INTERRUPT_EXCEPTIONS for f in failures):
            return INTERRUPT_EXIT_CODES[exit_code]
        return None
    stopped = all(f.exception_type in INTERRUPT_EXCEPTIONS for f in failures)
    if failures and stopped and exit_code in (None, 0):
        return INTERRUPT_EXCEPTIONS[failures[0].exception_type]
    return None


def _interrupted(
    how: str, failures: Sequence[StepFailure], exit_code: int | None, counts: Sequence[RankCount]
) -> Finding:
    evidence = [Evidence("stopped_by", how)]
    if exit_code is not None:
        evidence.append(Evidence("exit_code", exit_code))
    if failures:
        first = failures[0]
        where = f"in step {first.step} on rank {first.rank}"
        evidence += [Evidence("interrupted_rank", first.rank, "rank"),
                     Evidence("interrupted_step", first.step)]
        title = f"The run was interrupted at step {first.step} by {how}"
    else:
        last = max((c.last_step for c in counts), default=None)
        where = f"after step {last}" if last is not None else "before its first step"
        title = f"The run was interrupted {where} by {how}"
    return Finding(
        kind=RunKind.RUN_INTERRUPTED,
        severity=Severity.WARNING,
        score=None,
        title=title,
        why=(f"The run was stopped by {how} {where}; it did not fail. The step cut short is left out of "
             "the analysis."),
        next="The diagnosis covers the steps before the interrupt.",
        evidence=tuple(evidence),
    )


def _failed(
    failures: Sequence[StepFailure], failed_steps: int, exit_code: int | None, counts: Sequence[RankCount],
    outside: Sequence[tuple[int, str]] = (), extra: StepFailure | None = None,
) -> Finding:
    code = "" if exit_code is None else f" The script exited with code {exit_code}."
    evidence: list[Evidence] = []
    if exit_code is not None:
        evidence.append(Evidence("exit_code", exit_code))
    if outside:  # the rank whose own process raised is named, not a rank that failed after it
        rank, kind = outside[0]
        last = next((c.last_step for c in counts if c.rank == rank), None)
        after = f" after its step {last}" if last is not None else ""
        then = ""
        if failures:
            first = failures[0]
            then = (f"; rank {first.rank} then raised {first.exception_type} in step {first.step} "
                    "(likely a consequence)")
        others = f" (also ranks {', '.join(str(r) for r, _ in outside[1:9])})" if len(outside) > 1 else ""
        if kind.startswith("SIG"):  # crashed_ranks: a native abort, no Python exception
            title, why, blamed = _crashed(rank, kind, last, f"{others}{then}", extra)
            evidence += blamed
            why += code
        else:
            why = (f"Rank {rank} raised {kind} outside trace_step(){after} (a DataLoader, set-up or "
                   f"evaluation error; its rank-{rank}.export.json ends with it){others}{then}.{code}")
            title = f"The run failed: rank {rank} raised {kind} outside a step"
            evidence += [Evidence("failed_rank", rank, "rank"), Evidence("exception_type", kind)]
    elif failures:
        first = failures[0]
        others = failed_steps - 1
        more = f" ({others} other failed step{'s' if others != 1 else ''} on this run)" if others > 0 else ""
        why = (f"Rank {first.rank} raised {first.exception_type} in step {first.step}{more}; failed steps "
               f"are left out of the analysis.{code}")
        evidence += [Evidence("failed_rank", first.rank, "rank"), Evidence("failed_step", first.step),
                     Evidence("exception_type", first.exception_type)]
        title = f"The run failed at step {first.step} ({first.exception_type})"
    else:
        last = max((c.last_step for c in counts), default=None)
        after = f" after step {last}" if last is not None else ""
        why = (f"No traced step raised, but the script exited with code {exit_code}{after}: the failure was "
               "outside trace_step() (set-up, evaluation, saving) or a rank was killed.")
        title = f"The run failed (exit code {exit_code})"
    return Finding(
        kind=RunKind.RUN_FAILED,
        severity=Severity.CRITICAL,
        score=None,
        title=title,
        why=why,
        next="The diagnosis covers the steps before the failure; fix the error and run again for a full one.",
        evidence=tuple(evidence),
    )


def _crashed(
    rank: int, signal_name: str, last: int | None, after: str, extra: StepFailure | None
) -> tuple[str, str, list[Evidence]]:
    """Title, why and evidence of a run in which ``rank`` crashed on a signal (see crashed_ranks), or
    was killed (SIGKILL, as the launcher saw it)."""
    if signal_name == "SIGKILL":
        why = (f"Rank {rank} was killed (SIGKILL, as traceml run saw its children: the OOM killer, or a kill "
               f"from outside); the last of its steps to reach telemetry was {last}. It failed first: the "
               f"other ranks' errors are its consequences{after}. Check dmesg or the scheduler's events for "
               "an OOM kill.")
        return (f"The run failed: rank {rank} was killed (SIGKILL)", why,
                [Evidence("failed_rank", rank, "rank"), Evidence("exception_type", signal_name)])
    abort = (f"rank {rank} crashed ({signal_name}: it ended without shutting down; the last of its steps to "
             f"reach telemetry was {last}. A native abort: gloo, for one, aborts a rank this way on a "
             "collective mismatch, 'Received data size doesn't match expected size', and the rank's stderr "
             "has the message)")
    if extra is not None and extra.rank != rank:  # the other side of the mismatch made the extra call
        why = (f"Collective mismatch: rank {extra.rank}'s failed step {extra.step} moved more collective "
               "calls or bytes than any of its completed steps (an extra or larger collective call) and "
               f"raised {extra.exception_type}; {abort}. gloo aborts the rank that receives the larger "
               "message, here the other side.")
        title = (f"The run failed: collective mismatch, rank {extra.rank} made an extra collective call in "
                 f"step {extra.step} (rank {rank} crashed, {signal_name})")
        return title, why, [Evidence("failed_rank", extra.rank, "rank"), Evidence("failed_step", extra.step),
                            Evidence("exception_type", extra.exception_type),
                            Evidence("crashed_rank", rank, "rank")]
    why = abort[0].upper() + abort[1:] + after + "."
    if after:
        why += (" On such a mismatch gloo aborts the rank that received the larger message, which need not "
                "be the rank with the wrong call: compare the ranks' traceml.collective spans of that step.")
    return (f"The run failed: rank {rank} crashed ({signal_name})", why,
            [Evidence("failed_rank", rank, "rank"), Evidence("exception_type", signal_name)])
