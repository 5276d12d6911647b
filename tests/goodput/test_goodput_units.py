"""Goodput and MFU units: exact accounting on synthetic records, FLOPs counting, data problems, the
time record, the ledger and the rendering of hostile names. No subprocess; well under a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from traceml_otel.analyze.mfu import analyze_mfu, table_peak
from traceml_otel.analyze.run_model import StepTiming
from traceml_otel.analyze.time_accounting import account_time
from traceml_otel.capture.flops import StepFlopCounter
from traceml_otel.capture.time_ledger import TimeLedger, process_start_time
from traceml_otel.errors import SettingsError
from traceml_otel.report.time_section import mfu_sentence, time_html, time_json
from traceml_otel.settings import load_settings
from traceml_otel.wire.hang_record import HangRecord, StallEpisode
from traceml_otel.wire.time_record import FlopsRecord, OutsideTotal, TimeRecord, read_time_record

T0 = 1_700_000_000.0


def _step(number: int, start: float, traced: float, wait: float = 0.0, samples: int | None = 8,
          rank: int = 0) -> StepTiming:
    return StepTiming(run_id="r", rank=rank, step=number, start_unix_nano=int(start * 1e9),
                      traced_cpu=traced, input_wait_cpu=wait, phase_calls=(1, 1, 0, 0),
                      phase_cpu=(traced / 2, traced / 4, None, None), samples=samples)


def _record(**flops: object) -> TimeRecord:
    evaluation = OutsideTotal("evaluation", 4.0, 2, before_first_step_s=1.0, after_last_step_s=1.0)
    return TimeRecord(0, "r", process_start=T0, init_at=T0 + 1, written_at=T0 + 30, ended_at=T0 + 30,
                      steps=10, outside=(evaluation, OutsideTotal("checkpoint", 1.0, 1)),
                      flops=FlopsRecord(**flops))  # type: ignore[arg-type]


def test_exact_accounting_on_a_synthetic_rank() -> None:
    # start-up 5 s (1 s of it evaluation), 10 steps of 0.5 s wait + 1 s block from T0+5, a 4-s gap
    # after step 4 (3 s of outside work: 2 evaluation, 1 checkpoint; 1 s unnamed); a 2-s stall inside
    # step 7 (a 3-s block); after the last step 1 s evaluation, then shutdown to T0+30.
    steps, t = [], T0 + 5.5
    for number in range(10):
        traced = 3.0 if number == 7 else 1.0
        steps.append(_step(number, t, traced, wait=0.5))
        t += traced + 0.5 + (4.0 if number == 4 else 0.0)
    last_end = t - 0.5
    hang = HangRecord(rank=0, world_size=1, run_id="r", state="resolved", stalled_s=2.0, timeout_s=1.0,
                      step=7, in_step=True, phase="step", written_at=steps[7].start_unix_nano / 1e9 + 2.5,
                      resolved_at=steps[7].start_unix_nano / 1e9 + 2.5)
    account = account_time(steps, {0: _record()}, [hang])
    assert account is not None
    got = dict(account.ranks[0].categories)
    assert got["startup"] == pytest.approx(4.0)
    assert got["step.input_wait"] == pytest.approx(5.0)
    assert got["outside.evaluation"] == pytest.approx(4.0) and got["outside.checkpoint"] == pytest.approx(1.0)
    assert got["between_steps"] == pytest.approx(1.0)
    assert got["stalled"] == pytest.approx(2.0)
    assert got["shutdown"] == pytest.approx(T0 + 30 - last_end - 1.0)
    assert sum(got.values()) == pytest.approx(account.ranks[0].wall_s) == pytest.approx(30.0)
    steps_block = sum(v for k, v in got.items() if k.startswith("step.") and k != "step.input_wait")
    assert steps_block == pytest.approx(10 + 2 - 2)  # 12 s of blocks less the 2-s stall
    assert account.goodput == pytest.approx(10 / 30)


def _two_stalls(*earlier: StallEpisode, left_out_s: float = 0.0) -> tuple[list[StepTiming], HangRecord]:
    """10 steps of 0.5 s wait + 1 s block from T0+5 (step 7's block 3 s), a 5-s gap after step 2; the
    record's earlier episode: 3 s stalled in that gap; its own: 2 s stalled inside step 7."""
    steps, t = [], T0 + 5.5
    for number in range(10):
        traced = 3.0 if number == 7 else 1.0
        steps.append(_step(number, t, traced, wait=0.5))
        t += traced + 0.5 + (5.0 if number == 2 else 0.0)
    in_gap = StallEpisode(progress_at=T0 + 10.0, stalled_s=3.0, step=3, in_step=False, phase="between steps")
    step7 = steps[7].start_unix_nano / 1e9
    hang = HangRecord(rank=0, world_size=1, run_id="r", state="resolved", stalled_s=2.0, timeout_s=1.0,
                      step=7, in_step=True, phase="step", written_at=step7 + 2.5, resolved_at=step7 + 2.5,
                      earlier=(in_gap, *earlier), earlier_left_out=2 if left_out_s else 0,
                      earlier_left_out_s=left_out_s)
    return steps, hang


def _plain_record() -> TimeRecord:
    return TimeRecord(0, "r", process_start=T0, init_at=T0 + 1, written_at=T0 + 30, ended_at=T0 + 30,
                      steps=10)


def test_every_stall_of_a_rank_counts_once_where_it_happened() -> None:
    steps, hang = _two_stalls()
    account = account_time(steps, {0: _plain_record()}, [hang])
    got = dict(account.ranks[0].categories)
    assert got["stalled"] == pytest.approx(5.0)  # 3 s between steps + 2 s in step 7
    assert got["between_steps"] == pytest.approx(2.0)  # the 5-s gap less its 3-s stall
    assert got["startup"] == pytest.approx(5.0) and got["shutdown"] == pytest.approx(3.0)
    assert sum(got.values()) == pytest.approx(account.ranks[0].wall_s) == pytest.approx(30.0)
    assert account.goodput == pytest.approx(10 / 30)  # 12 s of blocks less the 2 s stalled in step 7
    overlapping = StallEpisode(steps[7].start_unix_nano / 1e9 + 1.0, 1.0, 7, True)  # inside the last one
    again = dict(account_time(steps, {0: _plain_record()}, [_two_stalls(overlapping)[1]]).ranks[0].categories)
    assert again == pytest.approx(got)  # overlapping episodes count once


@pytest.mark.parametrize("state", ["resolved", "hung"])
def test_quiet_work_after_the_last_step_is_shutdown_unless_the_rank_ended_hung(state: str) -> None:
    # 10 steps end at T0+20 (the last); a final save not marked outside_step runs to the rank's end at
    # T0+30 and the watchdog reported it 5 s in. Resolved at the clean end: shutdown, as in the live
    # counters. Still hung (the rank was killed stuck there): stalled.
    steps = [_step(number, T0 + 5.5 + 1.5 * number, 1.0, wait=0.5) for number in range(10)]
    last_end = T0 + 5.5 + 1.5 * 9 + 1.0
    resolved = T0 + 30.0 if state == "resolved" else None
    hang = HangRecord(rank=0, world_size=1, run_id="r", state=state, timeout_s=5.0, step=10, in_step=False,
                      phase="between steps", written_at=resolved or last_end + 5.0,
                      stalled_s=(resolved or last_end + 5.0) - last_end, resolved_at=resolved)
    account = account_time(steps, {0: _plain_record()}, [hang])
    got = dict(account.ranks[0].categories)
    stuck = T0 + 30 - last_end
    said = [n for n in account.notes if "without progress after its last step" in n]
    if state == "resolved":
        assert got["stalled"] == 0.0 and got["shutdown"] == pytest.approx(stuck)
        assert said == [f"rank 0: {stuck:.1f} s without progress after its last step (the hang watchdog "
                        "reported it; the rank came out of it and ended): work of its shutdown, billed to "
                        'shutdown; name a final save with traceml.outside_step("checkpoint")']
    else:
        assert got["stalled"] == pytest.approx(stuck) and got["shutdown"] == pytest.approx(0.0) and not said
    assert sum(got.values()) == pytest.approx(30.0)


def test_stalls_beyond_the_records_list_still_count() -> None:
    for left_out_s, between, in_steps in ((1.5, 0.5, 15.0), (4.0, 0.0, 13.0)):  # the rest from the steps
        steps, hang = _two_stalls(left_out_s=left_out_s)
        account = account_time(steps, {0: _plain_record()}, [hang])
        got = dict(account.ranks[0].categories)
        assert got["stalled"] == pytest.approx(5.0 + left_out_s)
        assert got["between_steps"] == pytest.approx(between)
        assert sum(v for k, v in got.items() if k.startswith("step.")) == pytest.approx(in_steps)
        assert sum(got.values()) == pytest.approx(30.0)
        assert any("2 earlier stall(s) beyond the hang record's list" in note for note in account.notes)


def test_findings_fit_the_category_and_abstain_below_the_share() -> None:
    record = TimeRecord(0, "r", process_start=T0, ended_at=T0 + 20, steps=2,
                        outside=(OutsideTotal("evaluation", 6.2, 3),))
    steps = [_step(0, T0 + 1, 5.0), _step(1, T0 + 6, 2.0)]
    account = account_time(steps, {0: record})
    evaluation = next(f for f in account.findings if f.category == "outside.evaluation")
    assert evaluation.text == "evaluation takes 31 % of wall time"
    assert "evaluate less often or on fewer batches" in evaluation.advice
    assert all(f.category != "startup" for f in account.findings)  # 1 s of 20: 5 %, under the share


def test_rank_without_a_time_record_is_named() -> None:
    account = account_time([_step(0, T0, 1.0, rank=0), _step(0, T0, 1.0, rank=1)], {0: _record()})
    assert account is not None and "rank 1" in account.notes[0]


def test_flop_counter_counts_stacked_linear_layers_analytically() -> None:
    width, layers, batch = 32, 6, 4
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    counted = []
    for accumulation in (1, 4):
        counter = StepFlopCounter()
        assert counter.start()
        for micro in torch.randn(batch * accumulation, width).chunk(accumulation):
            model(micro).sum().backward()
        counted.append(counter.stop())
    analytic = 6 * batch * width * width * layers - 2 * batch * width * width  # no input grad on layer 1
    assert counted[0] == pytest.approx(analytic, rel=0.02)
    assert counted[1] == pytest.approx(4 * analytic, rel=0.02)


def test_mfu_sources_agree_under_accumulation() -> None:
    steps = [_step(n, T0 + n, 0.75, wait=0.25, samples=32) for n in range(8)]
    per_step = 4 * 1e9  # 4 micro-batches of 8 samples, 1e9 FLOPs each
    declared = _record(declared_sum=per_step * 8, declared_steps=8, peak_flops=1e10)
    measured = _record(measured=per_step, measured_step=0, peak_flops=1e10)
    per_sample = _record(per_sample=per_step / 32, peak_flops=1e10)
    values = [analyze_mfu(steps, {0: record}).mfu for record in (declared, measured, per_sample)]
    assert values == pytest.approx([0.4, 0.4, 0.4])


def test_mfu_leaves_the_start_up_steps_out() -> None:
    # Step 0 compiles 6 s, then 40 steps of 0.1 s at 40 % MFU: the compile is start-up, not step time.
    steps = [_step(0, T0, 6.0), *(_step(n, T0 + 6 + n * 0.1, 0.1) for n in range(1, 41))]
    record = _record(declared_sum=4e8 * 41, declared_steps=41, peak_flops=1e10)
    assert analyze_mfu(steps, {0: record}, startup_through=0).mfu == pytest.approx(0.4)
    assert analyze_mfu(steps, {0: record}).mfu == pytest.approx(4e8 * 41 / 10.0 / 1e10)  # 16 %: diluted


def test_impossible_mfu_is_a_data_problem_never_a_number() -> None:
    steps = [_step(n, T0 + n, 0.5) for n in range(4)]
    too_high = analyze_mfu(steps, {0: _record(declared_sum=4e13, declared_steps=4, peak_flops=1e12)})
    assert too_high.mfu is None and "above 100 %" in too_high.problems[0] and "4e+13" in too_high.problems[0]
    assert "MFU not shown" in mfu_sentence(too_high) and "%" not in mfu_sentence(too_high).split(":")[0]
    on_cpu = analyze_mfu(steps, {0: _record(declared_sum=4e9, declared_steps=4)})
    assert on_cpu.mfu is None and "TRACEML_PEAK_FLOPS" in on_cpu.problems[0]
    no_steps = analyze_mfu([], {0: _record(declared_sum=4e9, declared_steps=4, peak_flops=1e12)})
    assert no_steps.mfu is None and "cannot be computed" in no_steps.problems[0]
    assert analyze_mfu(steps, {0: _record()}) is None  # nothing declared: MFU not asked for


def test_peak_table_and_settings() -> None:
    assert table_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert table_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert table_peak("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert table_peak("cpu", "bf16") is None
    assert load_settings({"TRACEML_PEAK_FLOPS": "989e12"}).peak_flops == 989e12
    for bad in ("fast", "-1", "inf"):
        with pytest.raises(SettingsError, match="TRACEML_PEAK_FLOPS"):
            load_settings({"TRACEML_PEAK_FLOPS": bad})
    with pytest.raises(SettingsError, match="TRACEML_MFU_DTYPE"):
        load_settings({"TRACEML_MFU_DTYPE": "int4"})


def test_ledger_counts_outermost_blocks_and_places_them(tmp_path: Path) -> None:
    steps = [0]
    ledger = TimeLedger(tmp_path, 3, "r", lambda: steps[0], min_interval_s=0.0)
    ledger.enter_outside()
    ledger.exit_outside("evaluation", in_step=False)  # before the first step
    steps[0] = 5
    ledger.enter_outside()
    ledger.enter_outside()  # nested: counted once, in the outermost kind
    ledger.exit_outside("inner", in_step=False)
    ledger.exit_outside("checkpoint", in_step=False)
    ledger.enter_outside()
    ledger.exit_outside("evaluation", in_step=True)  # inside a step: its time is the step's
    ledger.write(ended=True)
    record = read_time_record(tmp_path / "rank-3.time.json")
    kinds = {o.kind: o for o in record.outside}
    assert set(kinds) == {"evaluation", "checkpoint"} and kinds["checkpoint"].count == 1
    evaluation = kinds["evaluation"]
    assert evaluation.count == 1 and evaluation.before_first_step_s == evaluation.seconds
    assert kinds["checkpoint"].after_last_step_s == kinds["checkpoint"].seconds  # no step since
    assert record.ended_at is not None and record.steps == 5
    start = process_start_time()
    assert start is not None and start <= ledger.init_at


def test_hostile_kind_is_escaped_in_html_and_json(tmp_path: Path) -> None:
    hostile = '<script>alert(1)</script>\x1b[31m'
    record = TimeRecord(0, "r", process_start=T0, ended_at=T0 + 10, outside=(OutsideTotal(hostile, 5.0, 1),))
    account = account_time([_step(0, T0 + 1, 1.0)], {0: record})
    fake = type("A", (), {"time_account": account, "mfu": None})()
    html = time_html(fake)  # type: ignore[arg-type]
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert json.dumps(time_json(account, None))


def test_declared_flops_are_checked() -> None:
    from traceml_otel._api import _flops

    assert _flops(5) == 5.0 and _flops(None) is None
    for bad in (-1, float("nan"), float("inf"), "many"):
        assert _flops(bad) is None  # type: ignore[arg-type]


def test_steps_missing_from_the_spans_are_named() -> None:
    account = account_time([_step(0, T0 + 6, 1.0)], {0: _record()})  # the record says 10 steps
    assert any("9 of its 10 steps are missing" in note for note in account.notes)


def test_a_restarted_attempt_counts_earlier_attempts_apart_from_start_up() -> None:
    from dataclasses import replace as replaced

    record = replaced(_record(), process_start=T0 + 3.0, restart=1)
    steps = [_step(0, T0 + 6, 1.0)]
    got = dict(account_time(steps, {0: record}, launched_at=T0).ranks[0].categories)
    assert got["restarts"] == pytest.approx(3.0) and got["startup"] == pytest.approx(2.0)  # 6 - 3 - 1 s eval
    first = dict(account_time(steps, {0: replaced(record, restart=0)}, launched_at=T0).ranks[0].categories)
    assert "restarts" not in first and first["startup"] == pytest.approx(5.0)


def test_time_record_round_trip(tmp_path: Path) -> None:
    from dataclasses import replace as replaced

    from traceml_otel.wire.time_record import write_time_record

    record = replaced(_record(declared_sum=1e9, declared_steps=2, peak_flops=1e12), restart=2,
                      launcher_start=T0 - 1)
    write_time_record(tmp_path, record)
    assert read_time_record(tmp_path / "rank-0.time.json") == record


def test_the_framework_callbacks_say_where_a_resumed_run_started(monkeypatch) -> None:
    """The Trainer and Lightning callbacks pass their restored global step to ``resume_from``: a
    positive integer only (0 is a fresh start; a missing or odd value says nothing)."""
    from traceml_otel import _api  # the training API the driver calls
    from traceml_otel.integrations._driver import StepDriver

    said: list[int] = []
    monkeypatch.setattr(_api, "resume_from", said.append)
    driver = StepDriver({}, source="hf_trainer")
    for updates in (8, 0, None, True, "8", 2.0):
        driver.resumed_at(updates)
    assert said == [8]
    callbacks = Path(_api.__file__).parent / "integrations"
    assert 'resumed_at(getattr(state, "global_step", 0))' in (callbacks / "hf_trainer.py").read_text()
    lightning = (callbacks / "lightning_callback.py").read_text()
    assert 'resumed_at(getattr(trainer, "global_step", 0))' in lightning


def test_start_up_steps_are_billed_to_start_up_not_goodput() -> None:
    """The analyzer's start-up steps (a compile step 0 of 10 s among 1 s steps) move from the step
    categories to ``startup``; the categories still add up to the wall time, and goodput drops."""
    steps, t = [], T0 + 2.0
    for number in range(10):
        traced = 10.0 if number == 0 else 1.0
        steps.append(_step(number, t, traced, wait=0.5))
        t += traced + 0.5
    plain = account_time(steps, {0: _plain_record()})
    billed = account_time(steps, {0: _plain_record()}, startup_through=0)
    assert plain is not None and billed is not None
    before, after = dict(plain.ranks[0].categories), dict(billed.ranks[0].categories)
    assert after["startup"] == pytest.approx(before["startup"] + 10.5)  # its block and its input wait
    assert after["step.forward"] == pytest.approx(before["step.forward"] - 5.0)
    assert sum(after.values()) == pytest.approx(billed.ranks[0].wall_s)
    assert billed.goodput is not None and plain.goodput is not None
    assert billed.goodput == pytest.approx(plain.goodput - 10.0 / billed.wall_s)
