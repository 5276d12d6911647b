"""Deep captures' automatic triggers, in the emitter process, from the steps it already reads.

Each step's *busy* time is its wall time less its blocking collectives' and its DDP buckets' exposed
tail (the last completion after the last hand-over, ``emit/exposed_communication.py``): the time a rank
waits for slower ranks is not its own slowness: a straggler's peers see longer steps too, and must not
be captured for it. Triggers, after a warm-up of :data:`WARMUP_STEPS` steps (``docs/captures.md``):

- **spike**: busy > ``TRACEML_CAPTURE_SPIKE_K`` (3) x the p95 of the last 100 ordinary steps (spikes do
  not enter that baseline) and 5 ms more, alone (slow steps in a row are a new level: drift's business).
  A spike one period after an earlier one and one or two after another, the three of about one size
  (:data:`ALIKE`; up to 6 noise spikes in between do not matter), is captured where the next one is due
  (``at_step``, ``every``); so is the second of the rank's first two spikes when no other came and
  they are alike: a run that repeats its slow step only three times has no fourth to wait for.
  Spikes without a period are captured at once, from the fourth, only while they are dense
  (:data:`DENSE_SPIKES`): the steps after a lone spike are ordinary ones, and a capture spent on them
  would leave none for the period. A spike smaller than the rank's median wait for its peers (last 16
  steps) is that slower peer's shadow, as for drift below, and is not counted.
- **drift**: the median busy time of the last 16 steps > ``TRACEML_CAPTURE_DRIFT`` (1.5) x the median of
  the 200 before them. In a distributed run whose collectives this rank times, its reason is
  **straggler**: its own work grew, not its waits. A rank whose median wait in those 16 steps is at
  least its own rise waits for a slower peer: its slower work is that peer's shadow (a shared CPU or
  memory bus), so it asks nothing.
- **residual**: the residual's share (time in no phase, fetch or collective: host syncs, metrics,
  logging) of the last 32 steps' busy time >= 30 % and 15 points or more above the rank's own earlier
  level (the median share of the up to 128 steps before those 32, at least 64 of them, none in the
  warm-up): a jump, not a level. A residual that is steadily high is the analyzer's RESIDUAL_HEAVY; it
  is asked for once, when it has wasted time (the window's median residual over 30 % of its median busy
  time and 0.1 ms) and the capture fits the cost budget (``capture/capture_budget.py``).

A firing trigger writes ``rank-R.capture-request.json``; the trainer's poller applies the limits. The
emitter itself asks at most once per ``TRACEML_CAPTURE_INTERVAL_S`` and ``TRACEML_CAPTURE_MAX`` times, not
counting a request the poller refused (its status file says so: the limits, or the cost budget); after a
refusal it asks again at most every :data:`RETRY_S`.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from traceml_otel.capture.capture_budget import affordable
from traceml_otel.settings import CaptureSettings
from traceml_otel.wire.capture_record import (
    CaptureRequest,
    read_status,
    request_file_name,
    status_file_name,
    write_request,
)

WARMUP_STEPS = 10
BASELINE_STEPS = 100
RECENT_STEPS = 16
DRIFT_BASELINE_STEPS = 200
RESIDUAL_STEPS = 32
RESIDUAL_BASELINE_STEPS = 128
RETRY_S = 30.0
"""After a refused request, the emitter asks again at most this often (a file write each time)."""
RESIDUAL_SHARE = 0.30
RESIDUAL_JUMP = 0.15
RESIDUAL_FLOOR_S = 0.0001
"""A step's residual counts as wasted only above 30 % of its busy time and this much (microseconds of
bookkeeping are no anomaly)."""
WASTE_GROWTH = 1.5
"""After a refusal for the cost budget, a trigger asks again once its anomaly's waste grew this much
(its allowance grew with it), at most every :data:`STATUS_READ_S`."""
STATUS_READ_S = 1.0
SPIKE_FLOOR_S = 0.005
LEVEL_SHIFT = 8
"""This many spikes in a row are a new level, not spikes: they enter the baseline (drift's business)."""
SPIKES_KEPT = 32
"""The last spikes a period is looked for in (noise spikes on a loaded machine come between)."""
ALIKE = 3.0
"""Spikes one period apart are taken for one cause only when their busy times are within this factor
(a loaded machine's svd every 40th step: its first run 94 ms, the later ones 45-67 ms)."""
LATTICE_NOISE_MAX = 6
"""Other spikes allowed between the three that make a period. Among many noise spikes some three fall on
a lattice by chance (a loaded machine's healthy loop once read "recurs every 8,488 steps", three of 32
spikes): a cause that recurs is most of the spikes around it, noise that happens to line up is not."""
DENSE_SPIKES = 2.0
"""Spikes without a period are captured at once only when the last four came, on average, at least
every this many capture lengths (``TRACEML_CAPTURE_STEPS``): then the captured steps likely hold one."""
_START = itemgetter(2)
EVERY = 8
"""The p95, drift and residual windows are summarised every this many steps (a step costs the emitter
a few microseconds; sorting the windows every step cost it ~50 us)."""


def busy_and_residual(row: Sequence[Any]) -> tuple[float, float, bool]:
    """(busy seconds, residual seconds, timed collectives?) of one step row (``StepRow``'s layout).

    Phase and collective calls both hold their CPU start and end at indices 2 and 3; their union
    inside the step is its covered time."""
    start, end = row[1], row[2]
    if end <= start:
        return 0.0, 0.0, False
    phases = row[14] or ()
    collectives = row[15] if len(row) > 15 else None
    waits = 0
    if collectives:
        last_handed = last_done = None  # DDP's gradient buckets: backward waits for the last one's tail
        for call in collectives:
            if call[3] is None:
                continue
            if call[1] == "ddp":
                last_handed = call[2] if last_handed is None or call[2] > last_handed else last_handed
                last_done = call[3] if last_done is None or call[3] > last_done else last_done
            elif call[5]:
                waits += call[3] - call[2]
        if last_done is not None and last_handed is not None and last_done > last_handed:
            waits += last_done - last_handed  # as emit/exposed_communication.py measures it
        calls = sorted([*phases, *collectives], key=_START)
    else:
        calls = sorted(phases, key=_START)
    inside = 0
    last = start
    for call in calls:
        a, b = call[2], call[3]
        if b is None:
            continue
        if a < last:
            a = last
        if b > end:
            b = end
        if b > a:
            inside += b - a
            last = b
    fetch = row[21] if len(row) > 21 and row[21] else 0
    duration = end - start
    busy = duration - waits if duration > waits else 0
    residual = duration - inside - fetch
    return busy / 1e9, (residual if residual > 0 else 0) / 1e9, bool(collectives)


def period(spikes: Sequence[int], sizes: Sequence[float] | None = None) -> int | None:
    """The period of the last spike, when an earlier one sits one period before it and another one or
    two periods before that (a step off either way; a spike the load hid may leave that hole; up to
    :data:`LATTICE_NOISE_MAX` spikes of noise in between do not matter), else ``None``. With ``sizes``
    (each spike's busy time), the three must be alike (the largest at most :data:`ALIKE` x the
    smallest): one cause recurring costs about the same each time (its first run slower, from
    warm-up), and noise spikes that happen to fall on a lattice mostly do not."""
    last = spikes[-1]
    for i in range(len(spikes) - 2, -1, -1):
        earlier = spikes[i]
        gap = last - earlier
        if gap <= 1:
            continue
        for j in range(i - 1, -1, -1):
            if not any(abs(earlier - k * gap - spikes[j]) <= 1 for k in (1, 2)):
                continue
            if len(spikes) - j - 3 > LATTICE_NOISE_MAX:  # the spikes between the three, not theirs
                continue
            if sizes is None or _alike(sizes[-1], sizes[i], sizes[j]):
                return gap
    return None


def _alike(*sizes: float) -> bool:
    return max(sizes) <= ALIKE * min(sizes)


class CaptureTriggers:
    """One rank's triggers; :meth:`observe` takes each batch of rows the emitter reads."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, settings: CaptureSettings,
                 warn: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.world_size = world_size
        self.settings = settings
        self.warn = warn
        self.clock = clock
        self.baseline: deque[float] = deque(maxlen=BASELINE_STEPS)
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self.recent_waits: deque[float] = deque(maxlen=RECENT_STEPS)
        """The waits (wall less busy time) of the steps in :attr:`recent`."""
        self.older: deque[float] = deque(maxlen=DRIFT_BASELINE_STEPS)
        self.shares: deque[float] = deque(maxlen=RESIDUAL_STEPS)
        self.older_shares: deque[float] = deque(maxlen=RESIDUAL_BASELINE_STEPS)
        self.residuals: deque[float] = deque(maxlen=RESIDUAL_STEPS)
        self.spikes: list[int] = []
        self.spike_sizes: list[float] = []
        self._spikes_in_row = 0
        self._pending_spike: tuple[int, float, float] | None = None
        self._p95: float | None = None
        self._since_p95 = 0
        self._seen = 0
        self._level_asked = False
        self._first_ns: int | None = None
        self._last_ns = 0
        self._collectives = False
        self.requested = 0
        self._last_request: float | None = None
        self._status_read: float | None = None
        self.fired: list[CaptureRequest] = []
        self.wasted: dict[str, float] = {"spike": 0.0, "drift": 0.0, "residual": 0.0}
        """Seconds each kind of anomaly has wasted on this rank (the cost budget's second allowance):
        spikes' busy time over the baseline median, a slow level's over the level before (drift and
        straggler), the residual's median over 30 % of the median busy time and 0.1 ms, a step."""
        self._slow_level: float | None = None
        """The busy level before a slow period, while its excess counts as wasted."""
        self._refusal_of = ""
        """The id of the last request the poller's status says it refused..."""
        self._refused_for_budget = False
        """...and whether for its cost budget (then a grown waste asks again sooner)."""

    def observe(self, rows: Sequence[Sequence[Any]]) -> None:
        """Update the windows with a batch of steps; write a request when a trigger fires (rate-limited)."""
        for row in rows:
            try:
                self._step(row)
            except (TypeError, IndexError, ValueError):
                continue

    def _step(self, row: Sequence[Any]) -> None:
        if row[13] is not None:  # a step that raised is no sample
            return
        step = row[0]
        if self._first_ns is None:
            self._first_ns = row[1]
        self._last_ns = row[2]
        busy, residual, collectives = busy_and_residual(row)
        self._collectives = self._collectives or collectives
        if step < WARMUP_STEPS:
            return
        if self._spike(step, busy):
            return
        if self._slow_level is not None and busy > self._slow_level:
            self.wasted["drift"] += busy - self._slow_level
        if len(self.recent) == RECENT_STEPS:
            self.older.append(self.recent[0])
        self.recent.append(busy)
        self.recent_waits.append((row[2] - row[1]) / 1e9 - busy)
        if busy > 0:
            if len(self.shares) == RESIDUAL_STEPS:
                self.older_shares.append(self.shares[0])
            self.shares.append(residual / busy)
            self.residuals.append(residual)
        self._seen += 1
        if self._seen % EVERY == 0:
            self._drift(step)
            self._residual(step)

    def _spike(self, step: int, busy: float) -> bool:
        """Whether the step is a spike (kept out of the windows). A slow step is judged at the next step:
        followed by another slow one, it starts a new level (drift's business), not a spike."""
        if len(self.baseline) < 20:  # filling the baseline: spikes against its median stay out of it
            middle = statistics.median(self.baseline) if len(self.baseline) >= 3 else None
            if middle is None or busy <= self.settings.spike_k * middle or busy - middle < SPIKE_FLOOR_S:
                self.baseline.append(busy)
            return False
        if self._p95 is None or self._since_p95 >= EVERY:
            self._p95, self._since_p95 = statistics.quantiles(self.baseline, n=20)[-1], 0
        p95 = self._p95
        pending, self._pending_spike = self._pending_spike, None
        if busy <= self.settings.spike_k * p95 or busy - p95 < SPIKE_FLOOR_S:
            self._spikes_in_row = 0
            self.baseline.append(busy)
            self._since_p95 += 1
            if pending is not None:
                self._spike_seen(*pending)
            return False
        self._spikes_in_row += 1
        if self._spikes_in_row >= LEVEL_SHIFT:
            self.baseline.append(busy)
        if self._spikes_in_row == 1:
            self._pending_spike = (step, busy, p95)
            return True
        return False

    def _in_a_peers_shadow(self, rise: float) -> bool:
        """Whether this rank of a distributed run (its collectives timed) waits for a slower peer, over
        its last steps, at least as long as its own work rose by ``rise`` s: that rise is the peer's
        shadow (a shared CPU or memory bus), not the rank's own anomaly."""
        return (self._distributed and len(self.recent_waits) > 0
                and statistics.median(self.recent_waits) >= rise)

    @property
    def _distributed(self) -> bool:
        """A rank of a distributed run whose collectives it times (a slower work is then a straggler's)."""
        return self.world_size > 1 and self._collectives

    def _spike_seen(self, step: int, busy: float, p95: float) -> None:
        """A spike alone: captured where the next is due once a period shows (the third spike, or the
        second when the first two are the only ones and alike); without a period, at once from the
        fourth if spikes are dense. A spike in a slower peer's shadow is not this rank's: left out."""
        if self._in_a_peers_shadow(busy - p95):
            return
        self.spikes = [*self.spikes[-(SPIKES_KEPT - 1):], step]
        self.spike_sizes = [*self.spike_sizes[-(SPIKES_KEPT - 1):], busy]
        self.wasted["spike"] += max(0.0, busy - statistics.median(self.baseline))
        detail = (f"step {step}: {busy * 1e3:.1f} ms busy, {busy / p95:.1f} x the rank's p95 "
                  f"{p95 * 1e3:.1f} ms")
        every = period(self.spikes, self.spike_sizes)
        if every is None and len(self.spikes) == 2 and self.spikes[1] - self.spikes[0] > 2 and (
                _alike(*self.spike_sizes)):
            every = self.spikes[1] - self.spikes[0]  # a run with few repeats is caught at its third
        if every is not None:
            self._request("spike", f"{detail}; recurs every {every} steps: capturing the next one",
                          step, statistics.median(self.baseline), at_step=step + every - 1, every=every)
        elif len(self.spikes) >= 4 and self._dense():
            self._request("spike", detail, step, statistics.median(self.baseline))

    def _dense(self) -> bool:
        """Whether the last four spikes came at least every :data:`DENSE_SPIKES` capture lengths."""
        return self.spikes[-1] - self.spikes[-4] <= 3 * DENSE_SPIKES * self.settings.steps

    def _drift(self, step: int) -> None:
        if len(self.recent) < RECENT_STEPS or len(self.older) < 2 * RECENT_STEPS:
            return
        now = statistics.median(self.recent)
        if now <= self.settings.drift_factor * min(self.older):
            return  # the older median is no lower than their least: no drift, and no sort of 200 steps
        before = statistics.median(self.older)
        if before <= 0 or now <= self.settings.drift_factor * before or now - before < SPIKE_FLOOR_S:
            return
        if self._slow_level is None:  # the slow steps so far count as wasted, and those after them
            self._slow_level = before
            self.wasted["drift"] += sum(b - before for b in self.recent if b > before)
        straggler = self._distributed
        if self._in_a_peers_shadow(now - before):
            return
        reason = "straggler" if straggler else "drift"
        what = "this rank's own work" if straggler else "the rank's busy time"
        if self._request(reason, f"step {step}: {what} rose to {now * 1e3:.1f} ms a step (median of "
                                  f"{RECENT_STEPS}), {now / before:.1f} x the {before * 1e3:.1f} ms before",
                         step, before):
            self.older.clear()  # the new level is the next baseline
            self._slow_level = None

    def training_s(self) -> float:
        """The rank's training time seen so far: from its first step's start to its last step's end."""
        return (self._last_ns - self._first_ns) / 1e9 if self._first_ns is not None else 0.0

    def _residual(self, step: int) -> None:
        if len(self.shares) < RESIDUAL_STEPS:
            return
        # The waste of the last EVERY steps, from the window's medians: a descheduled step on a loaded
        # machine is no residual level (its time counts in no phase), a sync in every step is.
        excess = statistics.median(self.residuals) - max(RESIDUAL_SHARE * statistics.median(self.recent),
                                                         RESIDUAL_FLOOR_S)
        if excess > 0:
            self.wasted["residual"] += EVERY * excess
        share = statistics.median(self.shares)
        if share < RESIDUAL_SHARE:
            return
        what = "the residual (no phase, fetch or collective: host syncs, metrics, logging)"
        baseline = statistics.median(self.recent) if self.recent else None
        if len(self.older_shares) >= 2 * RESIDUAL_STEPS:
            earlier = statistics.median(self.older_shares)
            if share - earlier >= RESIDUAL_JUMP:
                if self._request("residual", f"step {step}: {what} jumped to {share:.0%} of the busy time "
                                             f"from {earlier:.0%} before", step, baseline):
                    self.older_shares.clear()  # the new level is the next baseline
                    self._level_asked = True  # that capture explains the level too
                return
        settings = self.settings
        wasted = self.wasted["residual"]
        if self._level_asked or wasted <= 0 or not affordable(self.training_s(), wasted,
                                                              settings.budget_share, settings.waste_share):
            return
        if self._request("residual", f"step {step}: {what} is steadily {share:.0%} of the busy time",
                         step, baseline):
            self._level_asked = True

    def _last_refused(self, now: float, wasted_s: float) -> bool:
        """Whether the poller refused this emitter's last request (then it does not count against the
        emitter's own limits) and it may be asked again: after :data:`RETRY_S`, or sooner when it was
        refused for its budget and the anomaly's waste, which pays for it, has grown by
        :data:`WASTE_GROWTH` since. The status file is read at most every :data:`STATUS_READ_S` until
        it answers for that request."""
        if not self.fired or self._last_request is None:
            return False
        last = self.fired[-1]
        if self._refusal_of != last.id:
            if self._status_read is not None and now - self._status_read < STATUS_READ_S:
                return False
            self._status_read = now
            status = read_status(self.run_dir / status_file_name(self.rank))
            if status is None or status.last_request != last.id or not status.last_refusal:
                return False
            self._refusal_of = last.id
            self._refused_for_budget = status.last_refusal.startswith("budget")
        waited = now - self._last_request
        grown = self._refused_for_budget and 0 < wasted_s and WASTE_GROWTH * last.wasted_s <= wasted_s
        if waited < RETRY_S and not grown:
            return False
        self.requested -= 1
        self._last_request = None
        return True

    def _request(self, reason: str, detail: str, step: int, baseline_s: float | None,
                 at_step: int | None = None, every: int | None = None) -> bool:
        settings = self.settings
        if not settings.auto:
            return False
        now = self.clock()
        kind = "drift" if reason == "straggler" else reason
        wasted = self.wasted.get(kind, 0.0)
        if self.requested >= settings.max_per_rank or (
                self._last_request is not None and now - self._last_request < settings.interval_s):
            if not self._last_refused(now, wasted):
                return False
        request = CaptureRequest(
            id=f"{reason}-r{self.rank}-s{step}-{int(time.time() * 1000) % 10**9}", reason=reason,
            detail=detail, at_step=at_step if at_step is not None else step + 1,
            requested_unix=time.time(),
            baseline_ms=None if baseline_s is None else round(baseline_s * 1e3, 3),
            every=every, wasted_s=round(wasted, 4))
        try:
            write_request(self.run_dir / request_file_name(self.rank), request)
        except OSError as error:
            self.warn(f"a capture request could not be written ({type(error).__name__}: {error})")
            return False
        self.requested += 1
        self._last_request = now
        self.fired.append(request)
        return True


def start_capture_triggers(
    run_dir: Path | None, hello: Any, warn: Callable[[str], None]
) -> CaptureTriggers | None:
    """One rank's triggers (``hello``: the trainer's :class:`~traceml_otel.wire.hello.Hello`), or ``None``
    when captures or their automatic triggers are off (``TRACEML_CAPTURE=0``, ``TRACEML_CAPTURE_AUTO=0``)."""
    from traceml_otel.settings import capture_settings

    try:
        settings = capture_settings()
    except Exception:
        return None  # the trainer said why, once
    if run_dir is None or not settings.enabled or not settings.auto:
        return None
    return CaptureTriggers(run_dir, hello.rank, hello.world_size, settings, warn)


def capture_settings_on() -> bool:
    """Whether deep captures are on for this run (``TRACEML_CAPTURE``; unusable settings: off)."""
    from traceml_otel.settings import capture_settings

    try:
        return capture_settings().enabled
    except Exception:
        return False
