"""One verdict from the ranks' hang records: who is stuck, where, and who waits for it.

Each rank's watchdog writes ``rank-R.hang.json`` (:mod:`traceml_otel.wire.hang_record`). A rank
that waits in collective N of process group G is not the problem: the problem is the rank that
never entered collective N of G (its count for G is below N), or entered a different collective
there (another kind, or the same kind from another call site). Those ranks are the culprits; each
is named with the ``file:line`` where its training thread is, and what it was doing. When every
rank waits in the same collective, no rank is missing from it, and the verdict says so.

The combination itself lives in :mod:`traceml_otel.wire.hang_verdict` (the launcher's hang monitor
and the emitter use it too); this module turns its verdict into the ``HANG`` finding of
``traceml analyze`` and keeps ``RUN_FAILED`` from blaming a rank that was only waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from traceml_otel.analyze.findings import Evidence, Finding
from traceml_otel.analyze.kinds import RunKind, Severity
from traceml_otel.wire.hang_record import STATE_HUNG, HangRecord
from traceml_otel.wire.hang_verdict import (  # re-exported: the analyzer's public names for them
    MAX_NAMED,
    MAX_RECORDS,
    HangVerdict,
    combine,
    describe_culprit,
    describe_waiting,
    faulthandler_record,
    hang_file_names,
    read_hang_records,
)
from traceml_otel.wire.hang_verdict import named_ranks as _named

__all__ = [
    "MAX_NAMED", "MAX_RECORDS", "HangVerdict", "combine", "describe_culprit", "describe_waiting",
    "faulthandler_record", "hang_file_names", "hang_finding", "read_hang_records", "with_hang",
]

HANG_KIND = RunKind.HANG


def hang_finding(verdict: HangVerdict, records: Sequence[HangRecord]) -> Finding:
    """The ``HANG`` finding of a report."""
    stalled = max((r.stalled_s for r in records if r.state == STATE_HUNG), default=0.0)
    culprit = verdict.culprits[0] if verdict.culprits else None
    title = (f"Hang: rank {culprit} stuck at {verdict.location}" if culprit is not None and verdict.location
             else f"Hang: {_named(verdict.culprits or verdict.waiting)} made no progress")
    evidence = [Evidence("stalled", round(stalled, 1), "s")]
    if culprit is not None:
        evidence.append(Evidence("culprit_rank", culprit, "rank"))
    if len(verdict.culprits) > 1:
        evidence.append(Evidence("culprit_ranks", str(list(verdict.culprits[:64]))))
    if verdict.location:
        evidence.append(Evidence("location", verdict.location))
    if verdict.waiting:
        evidence.append(Evidence("waiting_ranks", str(list(verdict.waiting[:64]))))
    return Finding(
        kind=HANG_KIND, severity=Severity.CRITICAL, score=None, title=title,
        why=f"The run stopped making progress: {verdict.sentence}.",
        next=("Look at the culprit's stack in its rank-R.hang.json (every thread is there); a rank waiting "
              "in a collective is only waiting for it."),
        evidence=tuple(evidence),
    )


def with_hang(
    findings: Sequence[Finding], verdict: HangVerdict, records: Sequence[HangRecord]
) -> tuple[Finding, ...]:
    """``findings`` with the ``HANG`` finding first, and ``RUN_FAILED`` or ``RUN_INTERRUPTED`` no longer
    naming a rank that was only waiting."""
    out = [hang_finding(verdict, records)]
    for finding in findings:
        if finding.kind == RunKind.RUN_FAILED:
            finding = _not_blaming_waiter(finding, verdict, "The run was ended while hung",
                                          ("failed_rank", "failed_step", "exception_type"))
        elif finding.kind == RunKind.RUN_INTERRUPTED:  # a stop (Ctrl-C, SIGTERM) of a hung run
            finding = _not_blaming_waiter(finding, verdict, "The run was interrupted while hung",
                                          ("interrupted_rank", "interrupted_step"))
        out.append(finding)
    return tuple(out)


def _not_blaming_waiter(
    finding: Finding, verdict: HangVerdict, title: str, dropped: tuple[str, ...]
) -> Finding:
    """``finding`` reworded when the rank it names (its first ``dropped`` evidence) was only waiting in
    the hang: that evidence goes, and the why points at the culprit."""
    named = next((e.value for e in finding.evidence if e.name == dropped[0]), None)
    if named is None or named in verdict.culprits:
        return finding
    culprit = f"rank {verdict.culprits[0]}" if verdict.culprits else "no rank that reported"
    return replace(
        finding, title=title,
        why=(f"The run was stopped during a hang; rank {named} was only waiting when it was interrupted. "
             f"The hang's cause: {culprit} (see the HANG finding)."),
        evidence=tuple(e for e in finding.evidence if e.name not in dropped),
    )
