"""The live time counters and MFU inputs of the emitter (emit/time_metrics.py) on synthetic records:
exact categories that add up to the wall time, the stall carved out of the step it happened in,
redone steps after a restart, the first-zero report, and both metric paths. No subprocess."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import generate_latest

from traceml_otel import contract as c
from traceml_otel.emit.step_metrics import RankLabels, StepMetrics
from traceml_otel.emit.time_metrics import MAX_OUTSIDE_KINDS, FirstZero, LiveTimeAccount
from traceml_otel.step_records import StepRecord
from traceml_otel.wire.hang_record import HangRecord
from traceml_otel.wire.time_record import FlopsRecord, OutsideTotal, TimeRecord, write_time_record

T0 = 1_700_000_000.0


def _step(number: int, start: float, end: float, wait: float, between: float | None,
          samples: int | None = 8) -> StepRecord:
    return StepRecord(step=number, start_ns=int(start * 1e9), end_ns=int(end * 1e9),
                      input_wait_ns=int(wait * 1e9), samples=samples,
                      between_steps_ns=None if between is None else int(between * 1e9))


def _record(tmp: Path, **extra: object) -> None:
    fields = {"process_start": T0, "init_at": T0 + 1, "written_at": T0 + 7, "steps": 2,
              "outside": (OutsideTotal("evaluation", 3.0, 1),)} | extra
    write_time_record(tmp, TimeRecord(0, "r", **fields))  # type: ignore[arg-type]


def _hang(since: float, until: float) -> SimpleNamespace:
    record = HangRecord(rank=0, world_size=1, run_id="r", state="resolved", stalled_s=1.0, timeout_s=1.0,
                        step=2, in_step=True, phase="step", detected_at=since + 1, written_at=since + 1.0,
                        resolved_at=until)
    return SimpleNamespace(record=record)


def test_categories_are_exact_and_add_up_to_the_wall_time(tmp_path: Path) -> None:
    # start-up 2 s; step 0 (0.1 s wait, 0.5 s block); a 4.1-s gap with a 3-s evaluation (1.0 s unnamed
    # after its 0.1-s wait); step 1; step 2 holds a 2-s stall in a 3.2-s block; shutdown 1.5 s.
    _record(tmp_path)
    account = LiveTimeAccount(tmp_path, 0, hang=_hang(T0 + 8.0, T0 + 10.0))
    account.add_step(_step(0, T0 + 2.1, T0 + 2.6, 0.1, None))
    account.add_step(_step(1, T0 + 6.7, T0 + 7.2, 0.1, 1.1))
    account.add_step(_step(2, T0 + 7.3, T0 + 10.5, 0.0, 0.1))
    account.end(at=T0 + 12.0)
    got = dict(account.totals())
    assert got == pytest.approx({
        "startup": 2.0, "step.input_wait": 0.2, "step.block": 2.2, "between_steps": 1.1, "stalled": 2.0,
        "shutdown": 1.5, "outside.evaluation": 3.0,
    })
    assert sum(got.values()) == pytest.approx(12.0)


def test_a_stall_after_the_last_step_is_counted_live_and_carved_from_the_next_gap(tmp_path: Path) -> None:
    _record(tmp_path, outside=())
    hang = SimpleNamespace(record=None)
    account = LiveTimeAccount(tmp_path, 0, hang=hang)
    account.add_step(_step(0, T0 + 1.0, T0 + 2.0, 0.0, None))
    hang.record = HangRecord(rank=0, world_size=1, run_id="r", state="hung", stalled_s=1.0, timeout_s=1.0,
                             step=1, in_step=False, phase="between", detected_at=T0 + 4, written_at=T0 + 4.0)
    account._stall_closed = (T0 + 4, T0 + 6.0)  # as if read while hung, 2 s before the resolution
    assert dict(account.totals())["stalled"] == pytest.approx(3.0)  # counted while it lasts
    hang.record = replace(hang.record, state="resolved", written_at=T0 + 8.0, stalled_s=5.0,
                          resolved_at=T0 + 8.0)
    # resolved, with no step after it yet: the next step (stalled) or the end (shutdown) places the rest
    assert dict(account.totals())["stalled"] == pytest.approx(3.0)
    account.add_step(_step(1, T0 + 9.0, T0 + 10.0, 0.5, 7.0))
    account.end(at=T0 + 10.0)  # (the first steps' input wait and blocks are counted by then)
    got = dict(account.totals())
    assert got["stalled"] == pytest.approx(5.0)  # not twice
    assert got["between_steps"] == pytest.approx(1.5)  # 7 s gap - 0.5 s wait - 5 s stall
    assert got["step.input_wait"] == pytest.approx(0.5)


@pytest.mark.parametrize("state", ["resolved", "hung"])
def test_quiet_work_after_the_last_step_is_shutdown_unless_the_rank_ended_hung(tmp_path: Path,
                                                                               state: str) -> None:
    # A final save not marked outside_step outlasts the hang timeout: the watchdog reports it, and
    # resolves it when the rank ends cleanly (shutdown); a rank that ended still hung stalled there.
    _record(tmp_path, outside=())
    account = LiveTimeAccount(tmp_path, 0, hang=SimpleNamespace(record=None))
    account.add_step(_step(0, T0 + 1.0, T0 + 2.0, 0.0, None))
    resolved = T0 + 6.0 if state == "resolved" else None
    account.hang.record = HangRecord(
        rank=0, world_size=1, run_id="r", state=state, stalled_s=2.0, timeout_s=1.0, step=1, in_step=False,
        phase="between steps", detected_at=T0 + 4.0, written_at=resolved or T0 + 4.0, resolved_at=resolved)
    if resolved:
        account.hang.record = replace(account.hang.record, stalled_s=4.0)  # from T0+2 to T0+6
    account.end(at=T0 + 6.5)
    got = dict(account.totals())
    if state == "resolved":
        assert got.get("stalled", 0.0) == pytest.approx(0.0) and got["shutdown"] == pytest.approx(4.5)
    else:
        assert got["stalled"] == pytest.approx(4.5) and got["shutdown"] == pytest.approx(0.0)
    assert sum(got.values()) == pytest.approx(6.5)


def test_a_stall_still_called_hung_ends_with_the_step_that_shows_progress(tmp_path: Path) -> None:
    # The emitter reads the step before the hang record's resolution: the stall ends at that step's end.
    _record(tmp_path, outside=())
    hung = HangRecord(rank=0, world_size=1, run_id="r", state="hung", stalled_s=1.0, timeout_s=1.0,
                      step=1, in_step=True, phase="step", detected_at=T0 + 4.0, written_at=T0 + 4.0)
    account = LiveTimeAccount(tmp_path, 0, hang=SimpleNamespace(record=hung))
    account.add_step(_step(0, T0 + 1.0, T0 + 2.0, 0.0, None))
    account.add_step(_step(1, T0 + 2.5, T0 + 9.0, 0.0, 0.5))  # stalled from T0+3 to its end
    account.end(at=T0 + 9.0)
    got = dict(account.totals())
    assert got["stalled"] == pytest.approx(6.0) and got["step.block"] == pytest.approx(1.0 + 0.5)


def test_redone_steps_after_a_resume_count_as_lost(tmp_path: Path) -> None:
    # The earlier attempt got to step 8; this one resumed from the checkpoint after step 5: its first
    # 3 steps redo steps 6-8.
    _record(tmp_path, outside=(), restart=1, resumed_from=5, earlier_progress=8)
    account = LiveTimeAccount(tmp_path, 0)
    t = T0 + 1.0
    for number in range(5):
        account.add_step(_step(number, t + 0.2, t + 1.2, 0.2, None if number == 0 else 0.2))
        t += 1.2
    account.end(at=t)
    got = dict(account.totals())
    assert got["redone_steps"] == pytest.approx(3 * 1.2)
    assert got["step.block"] == pytest.approx(2.0) and got["step.input_wait"] == pytest.approx(0.4)


def test_each_reader_sees_a_category_at_zero_first() -> None:
    zero = FirstZero()
    assert zero.apply([("startup", 0.0), ("step.block", 2.0)]) == [("startup", 0.0), ("step.block", 0.0)]
    assert zero.apply([("step.block", 3.0), ("outside.evaluation", 180.0)]) == [
        ("step.block", 3.0), ("outside.evaluation", 0.0)]
    assert zero.apply([("outside.evaluation", 180.0)]) == [("outside.evaluation", 180.0)]
    assert FirstZero().apply([("shutdown", 4.0)], final=True) == [("shutdown", 4.0)]  # the final export


def test_outside_kinds_are_bounded(tmp_path: Path) -> None:
    kinds = tuple(OutsideTotal(f"kind{i}", 1.0, 1) for i in range(MAX_OUTSIDE_KINDS + 4))
    _record(tmp_path, outside=kinds)
    account = LiveTimeAccount(tmp_path, 0)
    account.poll(force=True)
    outside = {name: value for name, value in account.totals() if name.startswith("outside.")}
    assert len(outside) == MAX_OUTSIDE_KINDS + 1 and outside["outside.other"] == 4.0


LABELS = RankLabels(run_id="r1", rank=3, local_rank=1, host="node-a", version="9.9.9", job="nightly")


def test_both_paths_carry_the_time_counter_and_the_mfu_inputs(tmp_path: Path) -> None:
    _record(tmp_path, flops=FlopsRecord(declared_sum=2e9, declared_steps=2, peak_flops=1e12))
    reader = InMemoryMetricReader()
    metrics = StepMetrics(Resource.create({}), LABELS, None, metric_reader=reader)
    from traceml_otel.emit.step_metrics import PrometheusStepMetrics

    scrape = PrometheusStepMetrics(None, metrics.state)
    metrics.watch_time_record(tmp_path, 0)

    def otlp() -> dict[str, list]:
        data = reader.get_metrics_data()
        return {m.name: list(m.data.data_points) for rm in data.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}

    def exposition() -> str:
        return generate_latest(scrape.registry).decode()

    assert c.METRIC_MODEL_FLOPS not in otlp()  # no step: no FLOPs yet
    first = exposition()
    assert 'traceml_time_seconds_total{traceml_job="nightly",traceml_rank="3",traceml_run_id="r1",' \
           'traceml_time_category="step.block"} 0.0' in first
    assert "traceml_peak_flops{" in first and "1e+12" in first
    from tests.emit.test_metrics import step

    for number in range(20):  # the first 20 steps are counted together (start-up or not)
        record, spans = step(number, 0.25, 0.05)
        metrics.record(record, spans)
    points = otlp()  # its first look (above) reported every category at 0
    blocks = {p.attributes[c.ATTR_TIME_CATEGORY]: p.value for p in points[c.METRIC_TIME]}
    assert blocks["step.block"] == pytest.approx(5.0) and blocks["outside.evaluation"] == 3.0
    assert [p.value for p in points[c.METRIC_MODEL_FLOPS]] == [0.0]  # first look: 0, then the value
    assert [p.value for p in otlp()[c.METRIC_MODEL_FLOPS]] == [pytest.approx(20e9)]
    assert [p.value for p in points[c.METRIC_PEAK_FLOPS]] == [1e12]
    later = exposition()
    assert 'traceml_time_category="step.block"} 5.0' in later
    flops = 'traceml_model_flops_total{traceml_job="nightly",traceml_rank="3",traceml_run_id="r1"}'
    assert f"{flops} 0.0" in later  # the scrape's first look at the FLOPs counter
    assert f"{flops} 2e+10" in exposition()


@pytest.mark.parametrize("stall", [False, True])
def test_a_batch_counts_what_its_steps_count_one_at_a_time(tmp_path: Path, stall: bool) -> None:
    """``add_steps`` (the emitter's batch path) gives the per-step totals: input fetched inside the
    block, waits longer than the gap, zero-length and negative blocks, unknown gaps, declared FLOPs;
    with a stall known it carves it as each step would."""
    import random

    rng = random.Random(7)
    _record(tmp_path, flops=FlopsRecord(declared_sum=6e9, declared_steps=3))
    steps, t = [], T0 + 2.0
    for number in range(300):
        wait, inside = rng.choice([0.0, 0.01, 0.2]), rng.choice([0, 0, 0.005])
        start = t + wait + rng.random() * 0.05
        end = start + rng.choice([0.0, 0.03, 0.4]) + inside
        between = None if number in (0, 150) else start - t - rng.choice([0.0, 0.3])
        steps.append(StepRecord(step=number, start_ns=int(start * 1e9), end_ns=int(end * 1e9),
                                input_wait_ns=int((wait + inside) * 1e9), samples=8,
                                between_steps_ns=None if between is None else int(between * 1e9),
                                input_wait_in_step_ns=int(inside * 1e9) if inside else None))
        t = end
    hang = _hang(T0 + 20.0, T0 + 24.0) if stall else None
    one, batched = LiveTimeAccount(tmp_path, 0, hang=hang), LiveTimeAccount(tmp_path, 0, hang=hang)
    for record in steps:
        one.add_step(record)
    for first in range(0, len(steps), 64):
        batched.add_steps(steps[first:first + 64])
    for account in (one, batched):
        account.end(at=t + 1.0)
    # rel 1e-6: one step at a time adds each step's seconds as a float; the batch sums integer
    # nanoseconds and converts once
    assert dict(batched.totals()) == pytest.approx(dict(one.totals()), rel=1e-6, abs=1e-6)
    assert (batched.flops, batched.flops_steps) == pytest.approx((one.flops, one.flops_steps))
    assert one.flops_steps == 300 and (dict(one.totals())["stalled"] > 0) == stall


def _steady_steps(first_s: list[float], steps: int, step_s: float = 0.012,
                  wait_s: float = 0.002) -> tuple[list[StepRecord], float]:
    """``steps`` steps from T0 + 2 s, the first ones lasting ``first_s``, the rest ``step_s``; and the end."""
    out, t = [], T0 + 2.0
    for number in range(steps):
        block = first_s[number] if number < len(first_s) else step_s
        out.append(_step(number, t + wait_s, t + wait_s + block, wait_s, None if number == 0 else wait_s))
        t += wait_s + block
    return out, t


def _steady_run(account: LiveTimeAccount, first_s: list[float], steps: int, step_s: float = 0.012) -> float:
    records, end = _steady_steps(first_s, steps, step_s)
    for record in records:
        account.add_step(record)
    return end


def test_a_compile_step_is_start_up_live_as_in_the_account(tmp_path: Path) -> None:
    # A torch.compile run: step 0 compiles 6 s, then 300 steps of 12 ms (the docs' real run). The
    # analyzer bills step 0 to start-up and leaves it out of MFU; the live counters now do the same.
    _record(tmp_path, outside=(), flops=FlopsRecord(declared_sum=2e9, declared_steps=2, peak_flops=1e12))
    account = LiveTimeAccount(tmp_path, 0)
    records, end = _steady_steps([6.0], 300)
    for record in records[:10]:
        account.add_step(record)
    got = dict(account.totals())
    assert got["step.block"] == 0.0 and account.flops == 0.0  # held: step 0 cannot be told yet
    for first in range(10, 300, 64):
        account.add_steps(records[first:first + 64])  # the emitter's batch path
    got = dict(account.totals())
    assert got["startup"] == pytest.approx(2.0 + 6.002)  # process start to the first fetch, then step 0
    assert got["step.block"] == pytest.approx(299 * 0.012, abs=1e-4)
    assert account.flops_steps == 299 and account.flops == pytest.approx(299e9)
    account.end(at=end)
    assert sum(dict(account.totals()).values()) == pytest.approx(end - T0, abs=1e-3)


@pytest.mark.parametrize(("first", "startup_steps"), [([], 0), ([0.05], 0), ([6.0, 4.0, 3.0, 2.0], 4)])
def test_the_live_start_up_steps_follow_the_analyzer_rule(tmp_path: Path, first: list[float],
                                                          startup_steps: int) -> None:
    # No slow step, a slow step under 10x, and four leading slow ones: with 30 steps the rule's tenth
    # (3) is full, so a fourth may still be start-up and nothing is decided; with 50 it is 4.
    from traceml_otel.analyze.startup_steps import startup_steps as rule

    _record(tmp_path, outside=())
    account = LiveTimeAccount(tmp_path, 0)
    records, end = _steady_steps(first, 60)
    for record in records[:30]:
        account.add_step(record)
    assert (dict(account.totals())["step.block"] == 0.0) == (startup_steps == 4)
    for record in records[30:]:
        account.add_step(record)
    times = [(first[n] if n < len(first) else 0.012) + 0.002 for n in range(60)]
    assert rule(times) == startup_steps
    got = dict(account.totals())
    slow = sum(first[:startup_steps]) + 0.002 * startup_steps
    assert got["startup"] == pytest.approx(2.0 + slow, abs=1e-4)
    assert got["step.block"] + got["step.input_wait"] == pytest.approx(end - T0 - 2.0 - slow, abs=1e-4)


def test_slow_steps_are_decided_after_30_s_and_a_short_run_at_its_end(tmp_path: Path) -> None:
    _record(tmp_path, outside=())
    slow = LiveTimeAccount(tmp_path, 0)  # a 200-s compile, then 15-s steps: decided at the third step
    _steady_run(slow, [200.0], 3, step_s=15.0)
    assert dict(slow.totals())["startup"] == pytest.approx(2.0 + 200.002, abs=1e-4)
    assert dict(slow.totals())["step.block"] == pytest.approx(30.0, abs=1e-4)
    assert dict(slow.totals())["step.input_wait"] == pytest.approx(0.004, abs=1e-4)
    short = LiveTimeAccount(tmp_path, 0)  # 10 steps: too few for the analyzer; counted as steps at the end
    end = _steady_run(short, [6.0], 10)
    assert dict(short.totals())["step.block"] == 0.0
    short.end(at=end)
    assert dict(short.totals())["step.block"] == pytest.approx(6.0 + 9 * 0.012, abs=1e-4)
