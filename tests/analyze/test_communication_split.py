"""Waiting for the last rank against transfer, split per step from the ranks' collective entries."""

from __future__ import annotations

import pytest

from traceml_otel.analyze.communication_rules import byte_size
from traceml_otel.analyze.communication_split import split_communication
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.emit.exposed_communication import step_exposures, wait_entries
from traceml_otel.step_records import CollectiveTiming, StepRecord

MS = 1_000_000


def step(
    rank: int, exposed_ms: float, entries: tuple[int, ...] | None, work: tuple[int, ...] | None
) -> StepTiming:
    return StepTiming("r", rank, 0, comm_calls=len(entries or (1,)), comm_exposed_cpu=exposed_ms / 1e3,
                      comm_entries=entries, comm_work=work)


def test_a_rank_that_worked_longer_is_waited_for_and_the_rest_is_transfer() -> None:
    # Rank 1 computes 10 ms longer and arrives 10 ms late; the all-reduce then takes 2 ms on both.
    ranks = [step(0, 12, (100 * MS,), (5 * MS,)), step(1, 2, (110 * MS,), (15 * MS,))]
    split = split_communication((0, 1), ([ranks[0]], [ranks[1]]), Clock.CPU)
    assert split[0].waiting == pytest.approx(0.010) and split[0].transfer == pytest.approx(0.002)
    assert split[0].waited_for == ((1, pytest.approx(0.010)),)
    assert split[1].waiting == 0 and split[1].transfer == pytest.approx(0.002) and split[1].entry_steps == 1


def test_arriving_late_only_because_the_previous_collective_ended_late_is_transfer() -> None:
    # Same work before the call; rank 1 left the previous collective 1 ms later (a collective's own cost).
    ranks = [step(0, 1.5, (100 * MS,), (MS,)), step(1, 0.5, (101 * MS,), (MS,))]
    split = split_communication((0, 1), ([ranks[0]], [ranks[1]]), Clock.CPU)
    assert split[0].waiting == 0 and split[0].transfer == pytest.approx(0.0015)


def test_waiting_never_exceeds_the_exposed_time_whatever_the_clock_offset() -> None:
    # A 50 ms clock offset between hosts: rank 1's entries look 50 ms late; rank 0 was exposed 3 ms.
    ranks = [step(0, 3, (100 * MS,), (5 * MS,)), step(1, 1, (150 * MS,), (60 * MS,))]
    split = split_communication((0, 1), ([ranks[0]], [ranks[1]]), Clock.CPU)
    assert split[0].waiting == pytest.approx(0.003) and split[0].transfer == 0


def test_without_entries_the_least_waiting_rank_is_the_transfer() -> None:
    ranks = [step(0, 12, None, None), step(1, 2, (110 * MS,), (15 * MS,))]
    split = split_communication((0, 1), ([ranks[0]], [ranks[1]]), Clock.CPU)
    assert split[0].waiting == pytest.approx(0.010) and split[0].transfer == pytest.approx(0.002)
    assert split[0].waited_for == ((1, pytest.approx(0.010)),) and split[0].entry_steps == 0


def test_the_emitter_records_each_blocking_entry_and_ddp_last_handover_with_the_work_before() -> None:
    def call(start: int, end: int, source: str = "api", blocking: bool = True) -> CollectiveTiming:
        return CollectiveTiming("all_reduce", source, start * MS, end * MS, 4, blocking)

    record = StepRecord(step=0, start_ns=10 * MS, end_ns=60 * MS, phases=(), input_wait_ns=2 * MS,
                        collectives=(call(20, 30, "ddp", False), call(25, 40, "ddp", False), call(45, 47),
                                     call(50, 51, blocking=False)))
    waits = wait_entries(record, step_exposures(record), 64, None)
    assert waits is not None
    # DDP: last hand-over at 25 ms, after 17 ms of work since the fetch began (8 ms); then the api call at
    # 45 ms, 5 ms after the buckets completed at 40 ms; the async call has no entry.
    assert waits.entries == [25 * MS, 45 * MS] and waits.work == [17 * MS, 5 * MS]
    assert waits.last_exit_ns == 47 * MS
    following = wait_entries(record, step_exposures(record), 64, 0)
    assert following is not None and following.work[0] == 25 * MS
    assert wait_entries(record, step_exposures(record), 1, None) is None  # over the limit: absent


def test_bytes_print_in_sensible_units() -> None:
    assert [byte_size(v) for v in (4, 4096, 405_544, 39_469_096, 3 << 30)] == [
        "4 B", "4.0 KiB", "396.0 KiB", "37.6 MiB", "3.00 GiB"]
