"""The findings about how a run ended, from the metric series alone (``analyze --prometheus``):
``HANG`` (a hang watchdog's report still open at the end), ``RUN_FAILED`` (an exception, a non-zero
exit, a crash signal, or a rank that vanished without an end: killed) and ``RUN_INTERRUPTED``
(stopped from outside by SIGTERM or SIGINT). The same kinds, culprit and evidence names as the local
copy's findings (:mod:`traceml_otel.analyze.evidence`, :mod:`traceml_otel.analyze.hang`); the metric
path has no stack, so no ``file:line``.
"""

from __future__ import annotations

from traceml_otel.analyze.findings import Evidence, Finding
from traceml_otel.analyze.kinds import RunKind, Severity
from traceml_otel.analyze.sources.prometheus_ends import RankExit, RunEnds

INTERRUPT_REASONS = {"SIGTERM": "SIGTERM", "SIGINT": "Ctrl-C (SIGINT)", "KeyboardInterrupt": "Ctrl-C"}
WAITING_PHASES = ("collective",)
MAX_NAMED = 8


def end_findings(ends: RunEnds) -> tuple[Finding, ...]:
    """HANG first (a failure or a stop of a hung run is its consequence), then RUN_FAILED or
    RUN_INTERRUPTED."""
    findings: list[Finding] = []
    if ends.stalls:
        findings.append(_hang(ends))
    failed = [e for e in ends.exits if e.status not in ("clean", "interrupted")
              and e.reason not in INTERRUPT_REASONS]
    stopped = [e for e in ends.exits if e not in failed and e.status != "clean"]
    if failed or ends.vanished or ends.first_failure is not None:
        findings.append(_failed(ends, failed, hung=bool(ends.stalls)))
    elif stopped:
        findings.append(_interrupted(stopped))
    return tuple(findings)


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in ranks[:MAX_NAMED])
    more = f" and {len(ranks) - MAX_NAMED} more" if len(ranks) > MAX_NAMED else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def _hang(ends: RunEnds) -> Finding:
    culprits = [s for s in ends.stalls if s.phase not in WAITING_PHASES]
    waiting = [s.rank for s in ends.stalls if s.phase in WAITING_PHASES]
    stalled = max(s.seconds for s in ends.stalls)
    evidence = [Evidence("stalled", round(stalled, 1), "s")]
    if culprits:
        first = culprits[0]
        title = f"Hang: rank {first.rank} stuck ({first.phase})"
        evidence.append(Evidence("culprit_rank", first.rank, "rank"))
        if len(culprits) > 1:
            evidence.append(Evidence("culprit_ranks", str([c.rank for c in culprits[:64]])))
        sentence = f"rank {first.rank} is stuck ({first.phase})"
        if waiting:
            sentence += f"; {_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} in a collective for it"
    else:
        title = f"Hang: {_ranks(waiting)} made no progress"
        sentence = f"{_ranks(waiting)} wait in a collective that no reporting rank is missing from"
    if waiting:
        evidence.append(Evidence("waiting_ranks", str(waiting[:64])))
    return Finding(
        kind=RunKind.HANG, severity=Severity.CRITICAL, score=None, title=title,
        why=f"The run stopped making progress: {sentence} (the hang watchdog's report on the metrics, "
            f"{stalled:.0f} s without progress).",
        next=("Look at the culprit's stack in its rank-R.hang.json in the run folder (every thread is "
              "there), or traceml analyze on the folder for the file:line; a rank waiting in a collective "
              "is only waiting for it."),
        evidence=tuple(evidence),
    )


def _failed(ends: RunEnds, failed: list[RankExit], hung: bool) -> Finding:
    evidence: list[Evidence] = []
    first_seen = ends.first_failure
    own = None if first_seen is None else next((e for e in failed if e.rank == first_seen[0]), None)
    if own is not None:  # the launcher saw it fail first, and it said how: the others are consequences
        how = own.reason or own.status
        others = [e.rank for e in failed if e is not own] + list(ends.vanished)  # it exited: never vanished
        also = f"; {_ranks(others)} ended or went silent after it (likely a consequence)" if others else ""
        why = f"Rank {own.rank} ended with {how} ({own.status}), the first rank traceml run saw fail{also}."
        title = f"The run failed: rank {own.rank} ended with {how}"
        evidence += [Evidence("failed_rank", own.rank, "rank"), Evidence("exception_type", how)]
    elif first_seen is not None:  # the launcher's view: the rank could not say how it ended
        rank, how = first_seen
        others = [e.rank for e in failed]
        reasons = ", ".join(sorted({e.reason or e.status for e in failed}))
        then = f"; {_ranks(others)} then ended with {reasons} (its consequence)" if others else ""
        killed = how.startswith("SIG")
        title = (f"The run failed: rank {rank} was killed ({how})" if killed
                 else f"The run failed: rank {rank} ended with {how}")
        why = (f"traceml run saw rank {rank} fail first ({how}: "
               + ("killed by the OS or from outside, so the rank said nothing itself" if killed
                  else "an exit status the rank could not report itself, e.g. a top-level raise SystemExit")
               + f"){then}.")
        evidence += [Evidence("failed_rank", rank, "rank"), Evidence("exception_type", how)]
    elif ends.vanished:
        rank = ends.vanished[0]
        then = ""
        if failed:
            then = (f"; {_ranks([e.rank for e in failed])} then ended with "
                    f"{', '.join(sorted({e.reason or e.status for e in failed}))} (likely a consequence)")
        why = (f"Rank {rank} stopped reporting without an end marker (killed: SIGKILL, the OOM killer, a "
               f"lost node){' with ' + _ranks(list(ends.vanished[1:])) if len(ends.vanished) > 1 else ''}"
               f"{then}.")
        title = f"The run failed: rank {rank} vanished without an end (killed)"
        evidence += [Evidence("failed_rank", rank, "rank"),
                     Evidence("vanished_ranks", str(list(ends.vanished[:64])))]
    else:
        first = failed[0]
        others = [e.rank for e in failed[1:]]
        also = f" (also {_ranks(others)})" if others else ""
        why = f"Rank {first.rank} ended with {first.reason or first.status} ({first.status}){also}."
        title = f"The run failed: rank {first.rank} ended with {first.reason or first.status}"
        evidence += [Evidence("failed_rank", first.rank, "rank"),
                     Evidence("exception_type", first.reason or first.status)]
    if hung:
        why += " It was hung before (HANG, above): the end is the consequence of the hang."
    return Finding(
        kind=RunKind.RUN_FAILED, severity=Severity.CRITICAL, score=None, title=title, why=why,
        next="The diagnosis covers the steps before the failure; fix the error and run again for a full one.",
        evidence=tuple(evidence),
    )


def _interrupted(stopped: list[RankExit]) -> Finding:
    how = INTERRUPT_REASONS.get(stopped[0].reason, stopped[0].reason or "a signal")
    return Finding(
        kind=RunKind.RUN_INTERRUPTED, severity=Severity.WARNING, score=None,
        title=f"The run was interrupted by {how}",
        why=(f"{_ranks([e.rank for e in stopped])} {'was' if len(stopped) == 1 else 'were'} stopped by "
             f"{how}; the run did not fail."),
        next="The diagnosis covers the steps before the interrupt.",
        evidence=(Evidence("stopped_by", how),),
    )
