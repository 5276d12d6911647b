"""The OTLP span budget: which steps' spans are exported, decided the same way on every rank.

``TRACEML_OTLP_SPANS`` (``auto``, ``all`` or ``sampled``; see docs/telemetry.md#span-budget) picks the
mode. A step is exported when either

- it falls in the **consistent sample**: the OpenTelemetry consistent probability rule on the step's
  trace id, ``R >= T`` with ``R`` the trace id's low 56 bits and ``T = (1 - p) * 2**56`` the
  threshold. The trace id is derived from (run id, step) alone (``contract.step_trace_id``), so
  every rank keeps or drops the same steps with no collective, and a kept waterfall is whole; or
- it is **anomalous in this rank's own view**: longer than :data:`SLOW_FACTOR` times the rolling
  median of its recent steps, after a gap (a stall) that long, a step that raised, or the slowest
  step so far in its window of :data:`WINDOW_STEPS` step numbers when it is longer than
  :data:`WINDOW_FACTOR` times that median (so a window's slowest step is kept whenever it stands
  out). These are kept with probability 1; or
- it is **around a deep capture** of this rank: every step from the one before a capture can start
  (its trigger's step, for a capture this emitter's triggers asked for; the first step decided after
  the rank's capture status shows a new capture started, for any other) to the step after its last
  captured step (its summary's ``steps``), at most :data:`CAPTURE_KEEP_MAX_STEPS`; also kept with
  probability 1 (:meth:`SpanBudget.capture_pending`, :meth:`SpanBudget.capture_done`).

Every exported span of a sampled step carries the W3C ``tracestate`` entry ``ot=th:<T>;rv:<R>`` (the
spec's form; ``th:0`` for a step kept with certainty) and the step span the attribute
``traceml.sampling.threshold`` (the same ``th`` value, readable where a backend's search API does
not return the tracestate), so backends and ``traceml analyze`` weight each step by ``1/p``.

The probability ``p`` is a fixed rate (``TRACEML_OTLP_SAMPLE_RATE``) or, lower, what keeps the
job's estimated span rate (``world size x steps/s x spans per step``) under
``TRACEML_OTLP_SPAN_BUDGET``. It changes only at step numbers that are multiples of
:data:`EPOCH_STEPS`, in powers of two, from the previous epoch's rate on this rank: ranks of a
synchronous job measure nearly the same rate and pick the same power; where two ranks still pick
different ones, the steps kept at the lower probability are kept by both (consistent sampling
nests), so those waterfalls stay whole.

Runs in the emitter, once per export batch: the training thread does nothing for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from traceml_otel import contract as c
from traceml_otel.emit.otlp_encode import SpanEncoder
from traceml_otel.emit.spans import SpanData
from traceml_otel.emit.step_protobuf import EncodedStep
from traceml_otel.settings import DEFAULT_OTLP_SPAN_BUDGET, OTLP_SPANS_MODES
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.sampling_threshold import LOW56, in_sample, threshold, threshold_hex

SPANS_AUTO, SPANS_ALL, SPANS_SAMPLED = OTLP_SPANS_MODES
DEFAULT_SPAN_BUDGET = DEFAULT_OTLP_SPAN_BUDGET
"""Spans per second for the whole job (``TRACEML_OTLP_SPAN_BUDGET``)."""
DEFAULT_SAMPLE_RATE = 0.1
"""``sampled`` mode's probability when ``TRACEML_OTLP_SAMPLE_RATE`` is not set."""
SLOW_FACTOR = 3.0
"""A step longer than this many times the rolling median (or after a gap that long) is kept."""
MEDIAN_STEPS = 64
"""Steps in the rolling median."""
WINDOW_STEPS = 256
"""Step-number windows in which the slowest step (so far) is kept when it stands out."""
WINDOW_FACTOR = 1.5
"""The window's slowest step so far is kept when it is longer than this many times the rolling median
(a window of steps that differ only by noise keeps none: at 1,024 ranks nearly every step is some
rank's slowest so far, and those would be partial waterfalls)."""
AUTO_MIN_RANKS = 64
"""``auto`` applies the budget only to jobs of at least this many ranks; a smaller job sends every span
(under 64 ranks at 2 steps/s and 7 spans a step is under 900 spans/s: only a toy loop of microsecond
steps would pass the budget, and it should not be sampled by surprise)."""
EPOCH_STEPS = 64
"""The probability may change only at step numbers that are multiples of this."""
MAX_HALVINGS = 24
"""The lowest budget probability is ``2**-24``."""
RAISE_BELOW = 0.5
"""The probability doubles again only when the doubled rate would use less than this share of the budget."""
CAPTURE_AFTER_STEPS = 1
"""Steps after a capture's last captured step that are kept with it."""
CAPTURE_KEEP_MAX_STEPS = 4096
"""Steps kept around one capture at most (a capture whose summary never comes, e.g. a crash)."""


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """What the environment asked of the span budget (``settings.py`` reads it)."""

    mode: str = SPANS_AUTO
    rate: float | None = None
    """``TRACEML_OTLP_SAMPLE_RATE`` (``None``: not set)."""
    budget_spans_per_s: float = DEFAULT_SPAN_BUDGET
    """The whole job's spans per second (0: no budget)."""

    @property
    def cap(self) -> float:
        """The highest probability the mode allows."""
        if self.mode == SPANS_ALL:
            return 1.0
        if self.rate is not None:
            return self.rate
        return DEFAULT_SAMPLE_RATE if self.mode == SPANS_SAMPLED else 1.0


@dataclass(frozen=True, slots=True)
class Kept:
    """A step kept for export: its ``tracestate`` and the step span's threshold attribute."""

    trace_state: str
    th: str


PLAIN = Kept("", "")
"""Exported as is: every step is kept (probability 1), so no tracestate is written."""


class SpanBudget:
    """One rank's keep-or-drop decisions for OTLP span export (see the module docstring)."""

    def __init__(self, settings: BudgetSettings, world_size: int) -> None:
        self.settings = settings
        self.world_size = max(1, world_size)
        self.probability = settings.cap
        self._threshold = threshold(self.probability)
        self._th = threshold_hex(self._threshold)
        self._recent: deque[int] = deque(maxlen=MEDIAN_STEPS)
        self._window = -1
        self._window_max = 0
        self._epoch = -1
        self._epoch_steps = self._epoch_spans = self._epoch_extra = 0
        self._epoch_first_ns: int | None = None
        self._epoch_last_ns = 0
        self.lowest_probability = self.probability
        """The lowest probability in force so far (for the account)."""
        self._capture_from: int | None = None
        """Steps from this one on are kept (a capture is pending or running; ``None``: none is)."""
        self._capture_until: int | None = None
        """...up to this one (its summary came; ``None``: not yet)."""

    def capture_pending(self, from_step: int) -> None:
        """A capture of this rank was asked for or has started: keep every step from ``from_step`` until
        :meth:`capture_done` says which steps it took (at most :data:`CAPTURE_KEEP_MAX_STEPS`)."""
        if self._capture_from is None or self._capture_until is not None:
            self._capture_from = from_step
        else:
            self._capture_from = min(self._capture_from, from_step)
        self._capture_until = None

    def capture_done(self, steps: Sequence[int]) -> None:
        """A capture's summary: its steps and the next :data:`CAPTURE_AFTER_STEPS` are kept, then the
        steps after are sampled again (those decided meanwhile were kept)."""
        if not steps:
            return
        if self._capture_from is None:  # a capture nothing announced: whatever is still to decide
            self._capture_from = min(steps) - 1
        self._capture_until = max(steps) + CAPTURE_AFTER_STEPS

    def capture_refused(self) -> None:
        """The pending capture was refused: no step is kept for it."""
        if self._capture_until is None:
            self._capture_from = None

    def _around_capture(self, step: int) -> bool:
        start = self._capture_from
        if start is None or step < start:
            return False
        until = self._capture_until
        if (until is not None and step > until) or step - start >= CAPTURE_KEEP_MAX_STEPS:
            self._capture_from = self._capture_until = None
            return False
        return True

    def decide(self, records: Sequence[StepRecord], trace_ids: Sequence[int], span_counts: Sequence[int],
               ) -> list[Kept | None] | None:
        """Per step: :class:`Kept` (export, with its tracestate; :data:`PLAIN` while the probability is
        1: no tracestate) or ``None`` (dropped by the budget); ``None`` for all of it when every step
        is :data:`PLAIN` (the probability stayed 1)."""
        recent = self._recent
        ordered = sorted(recent)
        median = ordered[len(ordered) // 2] if len(ordered) >= 8 else None
        out: list[Kept | None] = []
        for record, trace_id, spans in zip(records, trace_ids, span_counts, strict=True):
            step = record.step
            if step // EPOCH_STEPS != self._epoch:
                self._new_epoch(step // EPOCH_STEPS)
            duration = record.end_ns - record.start_ns
            if record.gpu_duration_ns is not None and record.gpu_duration_ns > duration:
                duration = record.gpu_duration_ns
            duration += record.input_wait_ns or 0
            if step // WINDOW_STEPS != self._window:
                self._window, self._window_max = step // WINDOW_STEPS, -1
            anomalous = record.exception_type is not None or self._around_capture(step)
            slowest = duration > self._window_max
            if slowest:
                self._window_max = duration
            if median is not None and not anomalous:
                limit = SLOW_FACTOR * median
                anomalous = (duration > limit or (record.between_steps_ns or 0) > limit
                             or (slowest and duration > WINDOW_FACTOR * median))
            sampled = in_sample(trace_id, self._threshold)
            if self._epoch_first_ns is None:
                self._epoch_first_ns = record.start_ns
            self._epoch_last_ns = max(self._epoch_last_ns, record.end_ns)
            self._epoch_steps += 1
            self._epoch_spans += spans
            recent.append(duration)
            if len(recent) < MEDIAN_STEPS:  # the first steps: the median moves with every one
                ordered = sorted(recent)
                median = ordered[len(ordered) // 2] if len(ordered) >= 8 else None
            if self._threshold == 0:
                out.append(PLAIN)
            elif sampled or anomalous:
                rv = f"{trace_id & LOW56:014x}"
                # An anomalous step is kept with certainty, in the sample or not: it counts once.
                th = "0" if anomalous else self._th
                if not sampled:
                    self._epoch_extra += 1
                out.append(Kept(f"ot=th:{th};rv:{rv}", th))
            else:
                out.append(None)
        if self._threshold == 0 and all(kept is PLAIN for kept in out):
            return None
        return out

    def _new_epoch(self, epoch: int) -> None:
        """Set the probability for ``epoch`` from the last epoch's rate on this rank."""
        steps, first, last = self._epoch_steps, self._epoch_first_ns, self._epoch_last_ns
        budget = self.settings.budget_spans_per_s
        if epoch == self._epoch + 1 and steps >= 2 and first is not None and last > first and budget > 0:
            steps_per_s = steps / ((last - first) * 1e-9)
            job_rate = self.world_size * steps_per_s * (self._epoch_spans / steps)
            extra = self._epoch_extra / steps  # kept anyway, whatever the probability
            cap = self.settings.cap
            p = self.probability
            while p > 2.0 ** -MAX_HALVINGS and job_rate * (p + extra) > budget:
                p /= 2
            while p * 2 <= cap and job_rate * (2 * p + extra) <= RAISE_BELOW * budget:
                p *= 2
            self._set_probability(min(cap, p))
        self._epoch = epoch
        self._epoch_steps = self._epoch_spans = self._epoch_extra = 0
        self._epoch_first_ns, self._epoch_last_ns = None, 0

    def _set_probability(self, probability: float) -> None:
        self.probability = probability
        self._threshold = threshold(probability)
        self._th = threshold_hex(self._threshold)
        self.lowest_probability = min(self.lowest_probability, probability)


class KeptEncoder:
    """Encodes a kept step's spans with its tracestate, and the step span with its threshold attribute
    (the shipper's ``convert_kept``)."""

    def __init__(self, encoder: SpanEncoder) -> None:
        self._encoder = encoder
        self._extra: dict[str, bytes] = {}

    def __call__(self, spans: Sequence[SpanData] | EncodedStep, kept: Kept) -> list[bytes]:
        encoder = self._encoder
        state = encoder.trace_state_field(kept.trace_state)
        extra = self._extra.get(kept.th)
        if extra is None:
            extra = encoder.attribute_fields({c.ATTR_SAMPLING_THRESHOLD: kept.th})
            if len(self._extra) < 64:
                self._extra[kept.th] = extra
        if isinstance(spans, EncodedStep):  # encoded ahead (emit/step_protobuf.py): the same bytes, spliced
            fields, splice = spans.encoded, encoder.with_trace_state
            return [splice(fields[0], state, extra), *[splice(field, state) for field in fields[1:]]]
        encode = encoder.encode
        return [encode(spans[0], state, extra), *[encode(span, state) for span in spans[1:]]]
