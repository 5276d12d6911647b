"""The step row: one completed step as the training thread hands it to the emitter.

A :class:`StepRow` is a ``list`` with named slots: every read and every later write goes by name
(the recorder fills in the device timings by name once CUDA events have completed), and on the
wire it is the same compact JSON list it always was, so encoding it costs what a plain list costs.
The recorder builds a plain list in this layout, positionally, once per step (a keyword call costs
more than the rest of the step's bookkeeping, see :meth:`StepRow.of`, and a ``StepRow`` 0.4 us more
than the list), and views it as a ``StepRow`` when it fills in device timings. Its phases and
collectives are :class:`PhaseRow` and :class:`CollectiveRow`, lists with named slots too. Times
are ``perf_counter_ns`` readings of the training process; :func:`decode_step` moves them onto the
epoch clock and returns a :class:`~traceml_otel.step_records.StepRecord` on the emitter side.

Fields are only ever appended, with a default (in :data:`APPENDED_DEFAULTS` here and in
``records.StepRecord``): a row from an older capture side (shorter) still decodes, and slots a
newer one appended (longer) are ignored. The layout is version 2 of the stream
(:data:`traceml_otel.wire.frames.WIRE_VERSION`), unchanged from version 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from traceml_otel.step_records import CollectiveTiming, LoaderSettings, PhaseTiming, StepRecord
from traceml_otel.wire.frames import WireError


def _slot(index: int, doc: str) -> Any:
    """A named read-write view of ``row[index]`` (reads run in C, through ``itemgetter``)."""

    def set_slot(row: list[Any], value: Any) -> None:
        row[index] = value

    return property(itemgetter(index), set_slot, doc=doc)


class PhaseRow(list):  # type: ignore[type-arg]
    """One call of one phase: ``[phase, call, start_ns, end_ns, gpu_offset_ns, gpu_duration_ns, nbytes]``,
    and for a forward of a step that ran more than one model, ``module`` appended (an eighth slot)."""

    __slots__ = ()
    phase = _slot(0, "``forward``, ``backward``, ``optimizer`` or ``h2d``.")
    call = _slot(1, "Which call of this phase in the step, from 0; ``None`` as the training thread "
                    "appends it (the emitter numbers it, :func:`calls_in_order`).")
    start_ns = _slot(2, "CPU clock reading at the start.")
    end_ns = _slot(3, "CPU clock reading at the end.")
    gpu_offset_ns = _slot(4, "CUDA events: from the step's start event to this call's start.")
    gpu_duration_ns = _slot(5, "CUDA events: this call's duration on the device.")
    nbytes = _slot(6, "Bytes moved (h2d copies only).")
    # (slot 7, ``module``: the model's class name, appended only to a forward of a step that ran several
    # models; rows without it keep seven slots, and such rows take the emitter's reference path)

    @classmethod
    def timed(cls, phase: str, call: int | None, start_ns: int, end_ns: int, nbytes: int | None) -> PhaseRow:
        """A phase call the CPU clock timed (its device timings come later, on CUDA).

        The recorder appends a plain list in this layout instead, once per phase call on the training
        thread (a list subclass costs about 0.3 us more to build and release), and views it as a
        ``PhaseRow`` when it fills in the device timings; both encode to the same JSON list.
        """
        return cls((phase, call, start_ns, end_ns, None, None, nbytes))


class CollectiveRow(list):  # type: ignore[type-arg]
    """One collective call: ``[kind, source, start_ns, end_ns, nbytes, blocking, gpu_offset_ns,
    gpu_duration_ns]``. ``end_ns`` is set when the call completes, possibly on another thread."""

    __slots__ = ()
    kind = _slot(0, "``all_reduce``, ``broadcast``, ...")
    source = _slot(1, "Who called it: ``ddp`` (a gradient bucket) or ``api`` (``torch.distributed``).")
    start_ns = _slot(2, "CPU clock reading at the call.")
    end_ns = _slot(3, "CPU clock reading at completion; None while it has not completed.")
    nbytes = _slot(4, "Bytes in the tensors it reduces or moves.")
    blocking = _slot(5, "True when the caller waited for the whole call.")
    gpu_offset_ns = _slot(6, "CUDA events: from the step's start event to the call.")
    gpu_duration_ns = _slot(7, "CUDA events: the call's duration on the device.")

    @classmethod
    def started(cls, *, kind: str, source: str, start_ns: int, nbytes: int, blocking: bool) -> CollectiveRow:
        """A collective that has just been called."""
        return cls((kind, source, start_ns, None, nbytes, blocking, None, None))


class StepRow(list):  # type: ignore[type-arg]
    """One completed step, as a list with named slots (see the module docstring for the rules)."""

    __slots__ = ()
    step = _slot(0, "The rank's step index, from 0.")
    start_ns = _slot(1, "CPU clock reading when the ``trace_step`` block opened.")
    end_ns = _slot(2, "CPU clock reading when it closed.")
    gpu_duration_ns = _slot(3, "CUDA events: start to end of the step on the device.")
    input_wait_ns = _slot(4, "CPU time spent in the fetches before the step.")
    input_wait_gpu_ns = _slot(5, "CUDA events: the same fetches, on the device.")
    input_fetches = _slot(6, "How many fetches fed the step.")
    prefetch_h2d_ns = _slot(7, "Host-to-device copies a prepared loader made before the step.")
    optimizer_steps = _slot(8, "Optimizer updates in the step.")
    parallelism = _slot(9, "``none``, ``ddp``, ``fsdp``, ...")
    peak_allocated_bytes = _slot(10, "CUDA peak allocated memory in the step.")
    peak_reserved_bytes = _slot(11, "CUDA peak reserved memory in the step.")
    device_total_bytes = _slot(12, "The device's total memory.")
    exception_type = _slot(13, "The exception that left the block, if any.")
    phases = _slot(14, "The phase calls, in order, in :class:`PhaseRow`'s layout (plain lists or PhaseRows).")
    collectives = _slot(15, "Appended: the collective calls (``[]`` before).")
    samples = _slot(16, "Appended: samples in the step.")
    tokens = _slot(17, "Appended: tokens in the step.")
    loader = _slot(18, "Appended: ``[num_workers, pin_memory, persistent_workers, "
                                         "prefetch_factor, batch_size, dataset]`` of a newly seen DataLoader "
                                         "(``dataset``, the class name, appended last).")
    source = _slot(19, "Appended: how the step was found: ``trace_step``, ``hf_trainer``, ``lightning`` or "
                       "``inferred``.")
    between_ns = _slot(20, "Appended: CPU time from the end of this rank's previous step to this step's "
                           "start, less time in ``outside_step`` blocks; None on the first step.")
    input_wait_in_step_ns = _slot(21, "Appended: CPU time in batch fetches inside the block (gradient "
                                      "accumulation's later micro-batches); 0 (or None) when there was none.")
    skipped_updates = _slot(22, "Appended: updates a ``GradScaler.step`` skipped in the step (inf/NaN "
                                "gradients: ``optimizer.step()`` not called).")

    @classmethod
    def of(
        cls, *, step: int, start_ns: int, end_ns: int, gpu_duration_ns: int | None = None,
        input_wait_ns: int | None = None, input_wait_gpu_ns: int | None = None, input_fetches: int = 0,
        prefetch_h2d_ns: int | None = None, optimizer_steps: int = 0, parallelism: str = "none",
        peak_allocated_bytes: int | None = None, peak_reserved_bytes: int | None = None,
        device_total_bytes: int | None = None, exception_type: str | None = None,
        phases: list[PhaseRow] | None = None, collectives: list[CollectiveRow] | None = None,
        samples: int | None = None, tokens: int | None = None, loader: list[Any] | None = None,
        source: str | None = None, between_ns: int | None = None, input_wait_in_step_ns: int | None = None,
        skipped_updates: int = 0,
    ) -> StepRow:
        """A row built by name; slots not given are "not measured" (None, 0, empty).

        Not for the training thread: a keyword call with this many arguments costs about 1 us in
        CPython 3.11, as much as the rest of ``end_step``. The recorder builds its rows
        positionally (a plain list, slots in the order above), views them as ``StepRow`` to set the
        device timings by name; ``tests/wire/test_step_row.py`` checks it puts each value in its slot.
        """
        return cls((
            step, start_ns, end_ns, gpu_duration_ns, input_wait_ns, input_wait_gpu_ns, input_fetches,
            prefetch_h2d_ns, optimizer_steps, parallelism, peak_allocated_bytes, peak_reserved_bytes,
            device_total_bytes, exception_type, [] if phases is None else phases,
            [] if collectives is None else collectives, samples, tokens, loader, source, between_ns,
            input_wait_in_step_ns, skipped_updates,
        ))

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> StepRow:
        """A row as read from a frame: a shorter row gets the appended fields' defaults, a longer
        one loses the slots this side does not know."""
        if not isinstance(values, list) or len(values) < FIRST_LAYOUT_FIELDS:
            raise WireError(f"a step row needs at least {FIRST_LAYOUT_FIELDS} fields")
        known = values[:ROW_FIELDS]
        return cls((*known, *APPENDED_DEFAULTS[len(known) - FIRST_LAYOUT_FIELDS:]))


ROW_FIELDS = 23
"""Slots in a row of this version."""
FIRST_LAYOUT_FIELDS = 15
"""Slots in the first layout (up to ``phases``); every later slot was appended."""
APPENDED_DEFAULTS: tuple[Any, ...] = ((), None, None, None, None, None, None, 0)
"""Values of the appended slots (collectives, samples, tokens, loader, source, between_ns,
input_wait_in_step_ns, skipped_updates) a shorter row lacks."""


def decode_step(values: Sequence[Any], anchor_ns: int) -> StepRecord:
    """Turn a step row read from a frame into a record, moving CPU readings onto the epoch clock.

    ``anchor_ns`` is the trainer's ``time_ns() - perf_counter_ns()`` (from its hello). The slots are
    unpacked in one statement, in the order of :class:`StepRow` (``tests/wire/test_step_row.py``
    checks each lands in its field): reading them one by one through the named views cost the
    emitter about 10 us per step.
    """
    if type(values) is not list or len(values) != ROW_FIELDS:
        values = StepRow.from_wire(values)
    (step, start_ns, end_ns, gpu_duration_ns, input_wait_ns, input_wait_gpu_ns, input_fetches,
     prefetch_h2d_ns, optimizer_steps, parallelism, peak_allocated_bytes, peak_reserved_bytes,
     device_total_bytes, exception_type, phase_rows, collective_rows, samples, tokens, loader, source,
     between_ns, in_step_wait_ns, skipped_updates) = values
    if isinstance(in_step_wait_ns, int) and in_step_wait_ns > 0:  # the step's input wait holds it too
        input_wait_ns = (input_wait_ns or 0) + in_step_wait_ns
    else:
        in_step_wait_ns = None
    if phase_rows and None in [row[1] if len(row) > 1 else 0 for row in phase_rows]:
        _number_unnumbered(phase_rows)  # as the training thread sends them: calls in order, unnumbered
    phases = tuple([
        PhaseTiming(phase, call, start + anchor_ns, end + anchor_ns, gpu_offset, gpu_duration, nbytes,
                    module if type(module) is str else None)
        for phase, call, start, end, gpu_offset, gpu_duration, nbytes, module in map(_phase_slots, phase_rows)
    ])
    collectives = tuple([
        CollectiveTiming(
            kind=k.kind, source=k.source, start_ns=k.start_ns + anchor_ns,
            end_ns=None if k.end_ns is None else k.end_ns + anchor_ns, nbytes=k.nbytes,
            blocking=bool(k.blocking), gpu_offset_ns=k.gpu_offset_ns, gpu_duration_ns=k.gpu_duration_ns,
        )
        for k in map(CollectiveRow, collective_rows)
    ]) if collective_rows else ()
    return StepRecord(  # positional, in the field order (the keyword call costs 1-2 us more per step)
        step, start_ns + anchor_ns, end_ns + anchor_ns, phases, gpu_duration_ns, input_wait_ns,
        input_wait_gpu_ns, input_fetches, prefetch_h2d_ns, optimizer_steps, parallelism,
        peak_allocated_bytes, peak_reserved_bytes, device_total_bytes, exception_type, samples, tokens,
        LoaderSettings(*loader[:6]) if loader else None, collectives,
        source if isinstance(source, str) else None,
        between_ns if isinstance(between_ns, int) and between_ns >= 0 else None, in_step_wait_ns,
        skipped_updates if isinstance(skipped_updates, int) and skipped_updates > 0 else 0,
    )


_PHASE_FIELDS = 8
"""Slots of a phase row with its model's class (the usual row has the first seven)."""


def calls_in_order(names: Sequence[Any]) -> tuple[int, ...]:
    """Each phase call's number (which call of its phase in the step, from 0) from the step's phase
    names in the order the calls ended: ``forward, backward, forward`` -> ``0, 0, 1``.

    The training thread leaves ``call`` as ``None`` (counting there cost every phase call a
    dictionary read and write); the order is all the count needs, so the emitter numbers them: once
    per run of rows of one shape on the default path (``emit/step_columns.py``), per row in
    :func:`decode_step`."""
    seen: dict[Any, int] = {}
    calls = []
    for name in names:
        call = seen.get(name, 0)
        calls.append(call)
        seen[name] = call + 1
    return tuple(calls)


def _number_unnumbered(phase_rows: list[Any]) -> None:
    """:func:`calls_in_order`, written into a row's unnumbered phase calls (a number already there
    stays and counts; a name that is not a string counts as ``None``'s)."""
    names = [phase[0] if len(phase) and isinstance(phase[0], str) else None for phase in phase_rows]
    for phase, call in zip(phase_rows, calls_in_order(names), strict=True):
        if isinstance(phase, list) and len(phase) > 1 and phase[1] is None:
            phase[1] = call


def _phase_slots(row: Sequence[Any]) -> Sequence[Any]:
    """A phase row's eight slots: a row of seven gets no model class, a longer row from a newer
    trainer loses the slots we do not know."""
    length = len(row)
    if length == 7:
        return (*row, None)
    return row if length == _PHASE_FIELDS else row[:_PHASE_FIELDS]
