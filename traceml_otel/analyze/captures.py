"""Deep captures in the analysis: the run folder's capture summaries, and findings that cite them.

A finding cites a capture when the capture explains it (``docs/captures.md``):

- ``RESIDUAL_HEAVY``: the host-device syncs the captured steps made (``aten::item``,
  ``cudaStreamSynchronize``, from ``train.py(80): step``), then their top operators by self time;
- the straggler kinds (``STRAGGLER``, ``COMPUTE_STRAGGLER``, ...): a capture taken on the straggling rank;
- any other finding: a capture whose trigger was a drift or a spike on one of the finding's ranks is
  listed, not claimed as the cause.

The citation is an :class:`~traceml_otel.analyze.findings.Evidence` named ``capture`` (the capture's
label, ``rank-R.capture-N``) and one sentence appended to the finding's *why*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from traceml_otel.analyze.findings import Evidence, Finding
from traceml_otel.analyze.kinds import RunKind, StepKind
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.wire.capture_in_flight import CaptureInFlight, read_in_flight
from traceml_otel.wire.capture_record import CaptureSummary, OpTime, read_statuses, read_summaries

STRAGGLER_KINDS = frozenset({StepKind.STRAGGLER, StepKind.COMPUTE_STRAGGLER, StepKind.INPUT_STRAGGLER,
                             StepKind.H2D_STRAGGLER})


@dataclass(frozen=True, slots=True)
class CaptureAnalysis:
    """The run's captures (taken ones first, by rank and index) and what could not be read."""

    captures: tuple[CaptureSummary, ...] = ()
    refusals: tuple[CaptureSummary, ...] = ()
    """Records of captures not taken (the user's profiler was running): index 0."""
    problems: tuple[str, ...] = ()
    refused: tuple[tuple[str, int, int], ...] = ()
    """Requests the ranks did not take, by why (a limit, the cost budget, a capture running): (why, count,
    ranks), from the ranks' ``rank-R.capture-status.json``; most first."""
    in_flight: tuple[CaptureInFlight, ...] = ()
    """Captures armed or running when their rank ended without a clean shutdown (a marker left behind:
    ``wire/capture_in_flight.py``)."""


NO_CAPTURES = CaptureAnalysis()


def read_captures(run_dir: Path, run_id: str) -> CaptureAnalysis:
    """The capture records of ``run_id`` in ``run_dir``."""
    summaries, problems = read_summaries(run_dir)
    mine = [s for s in summaries if not s.run_id or not run_id or s.run_id == run_id]
    counts: dict[str, list[int]] = {}
    for status in read_statuses(run_dir):
        for why, count in status.refused.items():
            total = counts.setdefault(why, [0, 0])
            total[0] += count
            total[1] += 1
    refused = tuple(sorted(((why, n, ranks) for why, (n, ranks) in counts.items()), key=lambda t: -t[1]))
    in_flight = tuple(m for m in read_in_flight(run_dir) if not (m.run_id and run_id) or m.run_id == run_id)
    return CaptureAnalysis(captures=tuple(s for s in mine if s.index > 0),
                           refusals=tuple(s for s in mine if s.index == 0), problems=tuple(problems[:5]),
                           refused=refused, in_flight=in_flight)


def profiled_steps(captures: Sequence[CaptureSummary]) -> frozenset[int]:
    """The steps a capture profiled, with the step before and after each (the profiler starts and stops
    between them)."""
    return frozenset(step for c in captures if c.steps for step in range(min(c.steps) - 1, max(c.steps) + 2))


def export_windows(captures: Sequence[CaptureSummary]) -> list[tuple[float, float]]:
    """Per capture with times, (profiler start, end of its trace's writing) in epoch seconds: every step
    that ran within shared the CPUs with the export thread (up to seconds). An export that waited (for
    the budget, or the end of training) gives two windows: the profiling, then the export."""
    out: list[tuple[float, float]] = []
    for c in captures:
        if not c.steps or c.started_unix <= 0:
            continue
        if c.export_began_unix > c.stopped_unix > 0:
            out += [(c.started_unix, c.stopped_unix), (c.export_began_unix, max(c.finished_unix,
                                                                                 c.export_began_unix))]
        else:
            out.append((c.started_unix, max(c.finished_unix, c.stopped_unix)))
    return out


def captured_steps(captures: Sequence[CaptureSummary], steps: Iterable[StepTiming] = ()) -> frozenset[int]:
    """The steps a deep capture slowed, on any rank: :func:`profiled_steps`, and those of ``steps`` that
    ran within an :func:`export_windows` window (the span reader's; the
    columnar engine finds the second kind in SQL)."""
    out = set(profiled_steps(captures))
    spans = export_windows(captures)
    for step in steps if spans else ():
        begin = step.start_unix_nano / 1e9
        end = begin + (step.traced_cpu or 0.0)
        if any(begin <= b and end >= a for a, b in spans):
            out.add(step.step)
    return frozenset(out)


def _op(op: OpTime) -> str:
    where = f" from {op.frame}" if op.frame else ""
    return f"{op.name} x{op.count}{where}"


def sentence(capture: CaptureSummary, kind: str) -> str:
    """What ``capture`` shows about a finding of ``kind``, in one sentence."""
    steps = (f"steps {capture.steps[0]}-{capture.steps[-1]}" if len(capture.steps) > 1
             else f"step {capture.steps[0]}" if capture.steps else "no step")
    head = f"Capture {capture.label()} ({capture.reason}, {steps})"
    top = ", ".join(f"{op.name} {op.share:.0%}" + (f" from {op.frame}" if op.frame else "")
                    for op in capture.top_cpu[:3])
    if kind == StepKind.RESIDUAL_HEAVY and capture.syncs:
        syncs = "; ".join(_op(op) for op in capture.syncs[:2])
        return f"{head}: host-device syncs {syncs}; top operators by self time: {top}."
    return f"{head}: top operators by self time: {top}."


def _explains(capture: CaptureSummary, finding: Finding, ranks: set[int]) -> int:
    """How well ``capture`` explains ``finding`` (0: not at all; higher first)."""
    if not capture.top_cpu:
        return 0
    if finding.kind == StepKind.RESIDUAL_HEAVY:
        return 3 if capture.syncs and capture.reason == "residual" else 2 if capture.syncs else 0
    if finding.kind in STRAGGLER_KINDS:
        if ranks and capture.rank not in ranks:
            return 0
        return 3 if capture.reason == "straggler" else 1
    if ranks and capture.rank not in ranks:
        return 0
    return 1 if capture.reason in ("drift", "spike", "on_demand") else 0


def _finding_ranks(finding: Finding) -> set[int]:
    return {int(e.value) for e in finding.evidence
            if e.unit == "rank" and isinstance(e.value, (int, float)) and not isinstance(e.value, bool)}


def cite(finding: Finding, captures: tuple[CaptureSummary, ...]) -> Finding:
    """``finding`` with the capture that explains it best, when one does."""
    if any(e.name == "capture" for e in finding.evidence):
        return finding
    ranks = _finding_ranks(finding)
    scored = sorted(((score, -c.rank, -c.index, c) for c in captures
                     if (score := _explains(c, finding, ranks)) > 0), key=lambda t: t[:3], reverse=True)
    if not scored:
        return finding
    capture = scored[0][3]
    return replace(finding, why=f"{finding.why} {sentence(capture, finding.kind)}",
                   evidence=(*finding.evidence, Evidence("capture", capture.label())))


def in_flight_sentence(marker: CaptureInFlight) -> str:
    """What a capture left in flight on a failed rank means, and what to do."""
    stack = " with Python stacks on" if marker.with_stack else ""
    state = ("was running" if marker.running else "was armed (its profiler about to start, or starting"
             + (f" at step {marker.at_step})" if marker.at_step is not None else ")"))
    return (f"A deep capture ({marker.reason}) {state} on rank {marker.rank} when it ended: "
            f"torch.profiler{stack} may have crashed it (such crashes are reported under load, most with "
            "stacks on), and telemetry cannot catch a crash inside it. A restart of this run takes no "
            "automatic capture; for a new run, set TRACEML_CAPTURE_STACK=0 (no Python tracer) or "
            "TRACEML_CAPTURE_AUTO=0 (captures only on demand), and tell us.")


def blame_in_flight(finding: Finding, in_flight: Sequence[CaptureInFlight]) -> Finding:
    """``finding`` (the run's failure) with a sentence when the rank it names failed with a capture in
    flight (:func:`in_flight_sentence`)."""
    ranks = {int(e.value) for e in finding.evidence if e.name in ("failed_rank", "crashed_rank")
             and isinstance(e.value, int | float)}
    marker = next((m for m in in_flight if m.rank in ranks), None)
    if finding.kind != RunKind.RUN_FAILED or marker is None:
        return finding
    return replace(finding, why=f"{finding.why} {in_flight_sentence(marker)}",
                   evidence=(*finding.evidence, Evidence("capture_in_flight", marker.rank, "rank")))
