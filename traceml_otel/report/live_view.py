"""The live view's model: every rank's ``rank-R.live.json`` folded into one bounded snapshot, and its line.

:class:`LiveFolder` reads a run folder's live records (re-reading only files whose size or time changed;
a shared filesystem works the same). :func:`snapshot` folds them into a :class:`LiveSnapshot`: progress,
step time and phase split as min/median/max across ranks with the slowest ranks by number (never one row
per rank), the window's verdict from the analyzer's own rules (:func:`~traceml_otel.analyze.rules.
diagnose_step_time`, run on each rank's window means), and flags: hangs with their ``file:line``, ranks
that stopped reporting with the age of their last report, ranks waiting, drops. :func:`live_line` is the
one-line form for logs (its format is documented in README.md, "Watching a run"). Everything printed
passes :func:`~traceml_otel.sanitize.strip_control`.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.analyze.findings import RankMetrics
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.rules import diagnose_step_time
from traceml_otel.sanitize import strip_control
from traceml_otel.wire._json import RecordError
from traceml_otel.wire.live_record import TRAINER_GONE, TRAINER_STOPPED, LiveRecord, read_live_record

SILENT_S = 3.0
"""A record older than this (its emitter stopped writing), or a stopped trainer, is a rank not reporting;
records are rewritten every second, so a silent rank shows within ``SILENT_S`` + one refresh < 5 s."""
WAITING_S = 3.0
"""A running rank with no step for max(this, 5 x its median step) is shown waiting."""
REREAD_S = 2.0
SLOWEST_K = 3
MAX_RANKS = 4096
"""Live records read from one folder at most."""
MAX_NAMED = 8
"""Ranks named in one flag; the rest are counted."""
PHASES = (("input", "input_wait"), ("h2d", "h2d"), ("fwd", "forward"), ("bwd", "backward"),
          ("opt", "optimizer"), ("comm", "communication"), ("residual", "residual"))
"""(short name, ``RankMetrics`` field) of the phase split, in step order."""


@dataclass(frozen=True, slots=True)
class Spread:
    """Min, median and max of one value across ranks, with who is lowest and highest."""

    low: float
    median: float
    high: float
    low_rank: int
    high_rank: int


@dataclass(frozen=True, slots=True)
class RankFlag:
    """One rank that is not simply training: ``not reporting``, ``waiting``, ``hung``, ``exited`` (ended
    otherwise than ``ok``: an exception, a signal, killed) or ``ended``."""

    rank: int
    state: str
    age_s: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class LiveSnapshot:
    """What the live view shows at one moment (bounded whatever the world size)."""

    run_id: str
    at: float
    world_size: int
    ranks_seen: int
    reporting: int
    steps: Spread | None
    steps_per_s: float | None
    samples_per_s: float | None
    step_median: Spread | None
    step_p95: Spread | None
    slowest: tuple[tuple[int, float], ...]
    fastest: tuple[tuple[int, float], ...]
    phases: tuple[tuple[str, Spread | None, float | None], ...]
    """(short name, seconds across ranks, median share of the step), every phase of :data:`PHASES`."""
    between: Spread | None
    outside: tuple[tuple[str, float, int], ...]
    goodput: Spread | None
    mfu: Spread | None
    memory_peak: tuple[int, int, int | None] | None
    """(bytes, rank, device total) of the highest CUDA peak."""
    verdict: str
    verdict_severity: str
    verdict_why: str
    flags: tuple[RankFlag, ...]
    dropped: int
    degraded: tuple[str, ...]
    ended: bool
    clock: str = "cpu"
    culprit: int | None = None
    """The rank the verdict names as holding the others back (a straggler verdict), else ``None``."""

    @property
    def not_reporting(self) -> tuple[RankFlag, ...]:
        return tuple(f for f in self.flags if f.state == "not reporting")

    @property
    def waiting(self) -> tuple[RankFlag, ...]:
        return tuple(f for f in self.flags if f.state in ("waiting", "hung"))


class LiveFolder:
    """Reads a run folder's ``rank-R.live.json`` records, re-reading the ones that changed.

    A file whose size and time look unchanged is still re-read every :data:`REREAD_S` (a network
    filesystem's attribute cache may hide a change that long). ``frozen_since`` keeps, per rank, when
    (this reader's clock) its ``seq`` last moved, so a silent rank is seen even when the writer's
    clock is skewed against the reader's (another host).
    """

    def __init__(self, run_dir: Path, run_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.records: dict[int, LiveRecord] = {}
        self.frozen_since: dict[int, float] = {}
        self._seen: dict[str, tuple[int, int, float]] = {}

    def read(self) -> dict[int, LiveRecord]:
        """The newest record of every rank (a record being replaced is read at the next call)."""
        try:
            with os.scandir(self.run_dir) as entries:
                names = [e.name for e in entries
                         if e.name.startswith("rank-") and e.name.endswith(".live.json")]
        except OSError:
            return self.records
        now = time.time()
        for name in names[:MAX_RANKS]:
            try:
                stat = os.stat(self.run_dir / name, follow_symlinks=False)
            except OSError:
                continue
            seen = self._seen.get(name)
            if seen is not None and seen[:2] == (stat.st_mtime_ns, stat.st_size) and now - seen[2] < REREAD_S:
                continue
            try:
                record = read_live_record(self.run_dir / name)
            except RecordError:
                continue
            self._seen[name] = (stat.st_mtime_ns, stat.st_size, now)
            if self.run_id and record.run_id and record.run_id != self.run_id:
                continue  # another run's leftovers
            old = self.records.get(record.rank)
            if old is None or (record.written_at, record.seq) >= (old.written_at, old.seq):
                self.records[record.rank] = record
                if old is not None and record.seq != old.seq:  # seen moving: from now on, our clock
                    self.frozen_since[record.rank] = now
        return self.records


def _spread(pairs: Sequence[tuple[int, float]]) -> Spread | None:
    if not pairs:
        return None
    low = min(pairs, key=lambda p: p[1])
    high = max(pairs, key=lambda p: p[1])
    return Spread(low[1], statistics.median(v for _, v in pairs), high[1], low[0], high[0])


def _values(records: Sequence[LiveRecord], get: object) -> list[tuple[int, float]]:
    out = []
    for record in records:
        value = get(record)  # type: ignore[operator]
        if value is not None:
            out.append((record.rank, float(value)))
    return out


def rank_metrics_of(record: LiveRecord) -> RankMetrics | None:
    """The analyzer's :class:`RankMetrics` from a record's window means (``None``: no window)."""
    w = record.window
    steps = int(w.get("steps") or 0)
    if not steps:
        return None
    return RankMetrics(
        rank=record.rank, steps=steps, step_time=w.get("step_time"), input_wait=w.get("input_wait"),
        traced=w.get("traced"), forward=w.get("forward"), backward=w.get("backward"),
        optimizer=w.get("optimizer") or 0.0, h2d=w.get("h2d") or 0.0,
        h2d_measured=bool(w.get("h2d_measured")),
        compute=w.get("compute"), residual=w.get("residual"),
        optimizer_updates=None if w.get("optimizer_updates") is None else int(w["optimizer_updates"] or 0),
        micro_steps=int(w.get("micro_steps") or 0), samples_per_step=w.get("samples_per_step"),
        tokens_per_step=w.get("tokens_per_step"), communication=w.get("communication"),
        communication_total=w.get("communication_total"),
        communication_measured=bool(w.get("communication_measured")),
        communication_waiting=w.get("communication_waiting"),
        communication_transfer=w.get("communication_transfer"), between_steps=w.get("between_steps"),
    )


def _step_base(record: LiveRecord) -> float | None:
    return record.window.get("step_time") or record.window.get("traced")


def rank_flag(record: LiveRecord, now: float, frozen_since: float | None = None) -> RankFlag | None:
    """Why a rank is not simply training now, or ``None``. ``frozen_since``: when the reader last saw
    the record's ``seq`` move (its own clock); ``None``: judge by the writer's ``written_at`` alone."""
    if record.ended:
        state = "ended" if record.end_status in ("ok", "") else "exited"
        return RankFlag(record.rank, state, max(0.0, now - record.written_at), record.end_status)
    last = record.last_step_at or record.started_at or record.written_at
    since_step = max(0.0, now - last)
    age = max(0.0, now - record.written_at)
    if frozen_since is not None and now - frozen_since > SILENT_S + REREAD_S:
        age = max(age, now - frozen_since)  # not moving, whatever the writer's clock says
    elif frozen_since is not None and now - frozen_since <= SILENT_S:
        age = min(age, now - frozen_since)  # moving: a writer's clock ahead or behind is not silence
    if age > SILENT_S:
        return RankFlag(record.rank, "not reporting", age, "no report")
    if record.trainer_state in (TRAINER_STOPPED, TRAINER_GONE):
        return RankFlag(record.rank, "not reporting", since_step, f"process {record.trainer_state}")
    hang = record.hang
    if hang.state == "hung":
        where = f" at {hang.location}" if hang.location else ""
        what = f" in {hang.collective}" if hang.collective else (f" in {hang.phase}" if hang.phase else "")
        return RankFlag(record.rank, "hung", since_step, f"{what.strip()}{where}".strip())
    if record.steps and since_step > max(WAITING_S, 5 * (record.step_median_s or 0.0)):
        return RankFlag(record.rank, "waiting", since_step, "no step")
    return None


def snapshot(records: dict[int, LiveRecord], now: float | None = None, k: int = SLOWEST_K,
             frozen_since: dict[int, float] | None = None) -> LiveSnapshot:
    """Fold the ranks' records into one :class:`LiveSnapshot` (see the module docstring);
    ``frozen_since``: :attr:`LiveFolder.frozen_since`."""
    now = time.time() if now is None else now
    ordered = [records[r] for r in sorted(records)]
    frozen = frozen_since or {}
    flags = [f for f in (rank_flag(r, now, frozen.get(r.rank)) for r in ordered) if f is not None]
    silent = {f.rank for f in flags if f.state == "not reporting"}
    live = [r for r in ordered if r.rank not in silent]
    world = max((r.world_size for r in ordered), default=0)
    medians = sorted(_values(ordered, lambda r: r.step_median_s), key=lambda p: -p[1])
    metrics = [m for m in (rank_metrics_of(r) for r in live) if m is not None]
    verdict, severity, why = "WAITING_FOR_STEPS", "info", "No rank has completed a step yet."
    culprit = None
    clock = Clock.GPU if live and all(r.clock == "gpu" for r in live) else Clock.CPU
    if metrics:
        parallelism = next((r.parallelism for r in live if r.window_steps), "none")
        primary = diagnose_step_time(metrics, clock, parallelism).primary
        verdict, severity, why = str(primary.kind), str(primary.severity), primary.why
        culprit = next((int(e.value) for e in primary.evidence if e.name == "culprit_rank"
                        and isinstance(e.value, int)), None)
    phases = []
    for short, name in PHASES:
        spread = _spread(_values(live, lambda r, n=name: r.window.get(n)))
        shares = [v / b for r in live
                  if (v := r.window.get(name)) is not None and (b := _step_base(r))]
        phases.append((short, spread, statistics.median(shares) if shares else None))
    outside: dict[str, tuple[float, int]] = {}
    for record in ordered:
        for kind in record.outside:
            seconds, count = outside.get(kind.kind, (0.0, 0))
            outside[kind.kind] = (max(seconds, kind.seconds), max(count, kind.count))
    rates = [r.steps_per_s for r in live if r.steps_per_s]
    samples = [r.steps_per_s * r.window["samples_per_step"] for r in live  # type: ignore[operator]
               if r.steps_per_s and r.window.get("samples_per_step")]
    peaks = [(r.cuda_peak_bytes, r.rank, r.cuda_total_bytes) for r in ordered if r.cuda_peak_bytes]
    degraded = tuple(dict.fromkeys(f"rank {r.rank}: {t}" for r in ordered for t in r.degraded))[:MAX_NAMED]
    return LiveSnapshot(
        run_id=next((r.run_id for r in ordered if r.run_id), ""), at=now, world_size=world,
        ranks_seen=len(ordered), reporting=len(ordered) - len(silent),
        steps=_spread(_values(ordered, lambda r: r.steps)),
        steps_per_s=statistics.median(rates) if rates else None,
        samples_per_s=sum(samples) if samples else None,
        step_median=_spread(medians), step_p95=_spread(_values(ordered, lambda r: r.step_p95_s)),
        slowest=tuple(medians[:k]), fastest=tuple(reversed(medians[-k:])) if len(medians) > k else (),
        phases=tuple(phases), between=_spread(_values(live, lambda r: r.window.get("between_steps"))),
        outside=tuple((kind, s, n) for kind, (s, n) in sorted(outside.items(), key=lambda i: -i[1][0]))[:6],
        goodput=_spread(_values(ordered, lambda r: r.goodput)),
        mfu=_spread(_values(ordered, lambda r: r.mfu)),
        memory_peak=max(peaks) if peaks else None,
        verdict=verdict, verdict_severity=severity, verdict_why=strip_control(why),
        flags=tuple(f for f in flags if f.state != "ended"), dropped=sum(r.dropped for r in ordered),
        degraded=tuple(strip_control(d) for d in degraded),
        ended=bool(ordered) and all(r.ended for r in ordered), clock=clock.value, culprit=culprit,
    )


# --- text ---------------------------------------------------------------------------------------------
def ms(value: float | None) -> str:
    """Seconds as milliseconds, 3 significant digits (``-``: unknown)."""
    if value is None:
        return "-"
    milli = value * 1e3
    return f"{milli:.3g}" if milli < 100 else f"{milli:.0f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.2f}GiB"


def ranks_text(flags: Sequence[RankFlag], with_age: bool = True) -> str:
    """``1:4.2s,5:7.0s`` (at most :data:`MAX_NAMED`, then ``+N``)."""
    named = [f"{f.rank}:{f.age_s:.1f}s" if with_age else str(f.rank) for f in flags[:MAX_NAMED]]
    more = f",+{len(flags) - MAX_NAMED}" if len(flags) > MAX_NAMED else ""
    return ",".join(named) + more if named else "-"


def flag_sentences(snap: LiveSnapshot) -> list[str]:
    """The flags in words, grouped by state (bounded)."""
    out = []
    groups: dict[str, list[RankFlag]] = {}
    for flag in snap.flags:
        groups.setdefault(flag.state, []).append(flag)
    for flag in groups.get("hung", [])[:MAX_NAMED]:
        out.append(f"rank {flag.rank} HUNG for {flag.age_s:.0f}s {flag.detail}".rstrip())
    if len(groups.get("hung", [])) > MAX_NAMED:
        out.append(f"... and {len(groups['hung']) - MAX_NAMED} more hung ranks")
    silent = groups.get("not reporting", [])
    if silent:
        details = sorted({f.detail for f in silent})
        out.append(f"NOT REPORTING: rank {ranks_text(silent)} (last report/step age; {', '.join(details)})")
    exited = groups.get("exited", [])
    if exited:
        reasons = sorted({f.detail for f in exited})[:3]
        out.append(f"EXITED: rank {ranks_text(exited, with_age=False)} ({'; '.join(reasons)})")
    waiting = groups.get("waiting", [])
    if waiting:
        out.append(f"waiting: rank {ranks_text(waiting)} (no step for that long"
                   + ("; likely waiting for the ranks not reporting)" if silent else ")"))
    if snap.dropped:
        out.append(f"telemetry dropped {snap.dropped} span(s)/step(s) so far")
    out += [f"degraded: {d}" for d in snap.degraded]
    return [strip_control(line) for line in out]


def live_line(snap: LiveSnapshot) -> str:
    """One stable, greppable ``key=value`` line (README.md, "Watching a run")."""
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.at))
    parts = [
        f"traceml-live t={stamp} run={snap.run_id or '-'}",
        f"ranks={snap.reporting}/{max(snap.world_size, snap.ranks_seen)}",
        f"steps={int(snap.steps.median) if snap.steps else 0}",
        f"steps_min={int(snap.steps.low) if snap.steps else 0}",
        f"steps_per_s={snap.steps_per_s:.3g}" if snap.steps_per_s else "steps_per_s=-",
        f"samples_per_s={snap.samples_per_s:.4g}" if snap.samples_per_s else "samples_per_s=-",
        f"step_ms={ms(snap.step_median.median if snap.step_median else None)}",
        f"p95_ms={ms(snap.step_p95.median if snap.step_p95 else None)}",
        f"step_ms_min={ms(snap.step_median.low if snap.step_median else None)}",
        f"step_ms_max={ms(snap.step_median.high if snap.step_median else None)}",
        "slowest=" + (",".join(f"{rank}:{ms(value)}" for rank, value in snap.slowest) or "-"),
        *(f"{short}={pct(share)}" for short, _, share in snap.phases),
        f"between_ms={ms(snap.between.median if snap.between else None)}",
        f"goodput={pct(snap.goodput.median if snap.goodput else None)}",
        f"mfu={pct(snap.mfu.median if snap.mfu else None)}",
        f"mem_peak={gib(snap.memory_peak[0] if snap.memory_peak else None)}",
        f"verdict={snap.verdict}",
        f"silent={ranks_text(snap.not_reporting)}",
        f"waiting={ranks_text(snap.waiting)}",
        "hang=" + (next((f.detail.replace(' ', '_') or 'yes' for f in snap.flags if f.state == 'hung'), "-")),
        f"dropped={snap.dropped}",
        f"culprit={'-' if snap.culprit is None else snap.culprit}",
    ]
    return strip_control(" ".join(parts))
