"""The run's cap on captures holds when every rank asks at once (a job-wide anomaly at 1,024 ranks): the
slots are claimed atomically in the run folder, by racing processes and through real pollers."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from types import SimpleNamespace

from traceml_otel.capture.capture_export import CaptureExporter, claim_run_slot
from traceml_otel.capture.capture_poller import CapturePoller
from traceml_otel.capture.profiler_capture import ProfilerCapture
from traceml_otel.settings import CaptureSettings
from traceml_otel.wire.capture_record import (
    CaptureRequest,
    read_status,
    request_file_name,
    status_file_name,
    write_request,
)


def _claim(run_dir: str, rank: int, gate: object, out: object) -> None:
    gate.wait()  # type: ignore[attr-defined]
    out.put((rank, claim_run_slot(Path(run_dir), rank, 8)))  # type: ignore[attr-defined]


def test_48_processes_racing_for_8_slots_get_exactly_8(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    gate, out = context.Barrier(48), context.Queue()
    workers = [context.Process(target=_claim, args=(str(tmp_path), rank, gate, out)) for rank in range(48)]
    for worker in workers:
        worker.start()
    got = dict(out.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    slots = [slot for slot in got.values() if slot is not None]
    assert sorted(slots) == list(range(8)), got
    owners = {int((tmp_path / f".capture-slot-{n}").read_text()) for n in range(8)}
    assert owners == {rank for rank, slot in got.items() if slot is not None}


def test_a_read_only_run_folder_claims_nothing(tmp_path: Path) -> None:
    assert claim_run_slot(tmp_path / "missing", 0, 8) is None


def test_pollers_of_many_ranks_asked_at_once_take_the_run_cap_and_refuse_the_rest(tmp_path: Path) -> None:
    settings = CaptureSettings(interval_s=0.0, max_per_run=3)
    pollers = []
    for rank in range(12):
        session = SimpleNamespace(recorder=SimpleNamespace(step=0), block_model=None)
        exporter = CaptureExporter(tmp_path, "run", rank, settings, print)
        capture = ProfilerCapture(session, settings, exporter, print)  # type: ignore[arg-type]
        capture.training_since = time.monotonic() - 1000.0  # the cost budget has room: only the cap refuses
        pollers.append((CapturePoller(capture, tmp_path, rank, settings, print), capture, exporter))
        write_request(tmp_path / request_file_name(rank),
                      CaptureRequest(id=f"job-wide-r{rank}", reason="spike", requested_unix=time.time()))
    try:
        for poller, _, _ in pollers:
            poller.poll()
        armed = [rank for rank, (_, capture, _) in enumerate(pollers) if capture.pending is not None]
        assert len(armed) == 3, armed
        for rank, _ in enumerate(pollers):
            status = read_status(tmp_path / status_file_name(rank))
            assert status is not None
            assert (status.last_refusal == "") == (rank in armed), (rank, status.last_refusal)
            if rank not in armed:
                assert status.last_refusal == "run cap (3 captures)"
    finally:
        for _, _, exporter in pollers:
            exporter.close(1.0)
