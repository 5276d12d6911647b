"""``traceml capture``: ask a running job's ranks for a deep capture (``docs/captures.md``).

It writes the run folder's ``capture-request.json`` (an id, ``on_demand``, the ranks, the steps); each
rank's poller reads it within ``TRACEML_CAPTURE_POLL_S``, profiles its next steps and writes
``rank-R.capture-N.trace.json.gz`` and ``rank-R.capture-N.json``. With ``--wait`` (default 60 s) the
command waits for those summaries and prints where they are.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

from traceml_otel.cli.common import EXIT_ERROR, EXIT_NO_DATA, EXIT_OK
from traceml_otel.sanitize import strip_control
from traceml_otel.wire.capture_record import (
    MAX_REQUEST_STEPS,
    REQUEST_FILE,
    CaptureRequest,
    CaptureSummary,
    read_summaries,
    write_request,
)


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``traceml capture``."""
    parser.add_argument("run_dir", nargs="?", type=Path, help="the run folder (traceml-runs/RUN_ID)")
    parser.add_argument("--run-id", help="the run's id, under TRACEML_RUNS_DIR (default traceml-runs)")
    parser.add_argument("--ranks", help="comma-separated ranks (default: every rank)")
    parser.add_argument("--steps", type=int, default=0,
                        help=f"steps to capture, 1 to {MAX_REQUEST_STEPS} (default TRACEML_CAPTURE_STEPS, 3)")
    parser.add_argument("--wait", type=float, default=60.0,
                        help="seconds to wait for the captures (default 60; 0 returns at once)")


def _ranks(raw: str | None) -> tuple[int, ...]:
    if not raw:
        return ()
    ranks = tuple(sorted({int(part) for part in raw.split(",") if part.strip()}))
    if any(rank < 0 for rank in ranks) or len(ranks) > 4096:
        raise ValueError("ranks must be 0 or more, at most 4096 of them")
    return ranks


def resolve_run_dir(args: argparse.Namespace) -> Path:
    """The run folder from ``RUN_DIR`` or ``--run-id`` (a safe name under the runs folder)."""
    if args.run_dir is not None:
        return Path(args.run_dir)
    if not args.run_id:
        raise ValueError("give a run folder, or --run-id ID")
    from traceml_otel.run_identity import checked_name
    from traceml_otel.settings import runs_dir

    return runs_dir() / checked_name("run id", args.run_id)


def ask_capture(run_dir: Path, ranks: tuple[int, ...] = (), steps: int = 0,
                detail: str = "asked for with traceml capture") -> CaptureRequest:
    """Write the run's ``capture-request.json`` (``traceml capture``, ``traceml top``'s ``c`` key).

    Raises:
        OSError: the run folder cannot be written, or a link sits at the file.
    """
    request = CaptureRequest(id=f"cli-{uuid.uuid4().hex[:12]}", reason="on_demand", steps=steps,
                             ranks=ranks, detail=detail, requested_unix=time.time())
    write_request(run_dir / REQUEST_FILE, request)
    return request


def run_capture(args: argparse.Namespace) -> int:
    """Write the request; with ``--wait``, wait for the captures it asked for."""
    try:
        run_dir = resolve_run_dir(args)
        ranks = _ranks(args.ranks)
    except ValueError as error:
        print(f"traceml capture: error: {strip_control(str(error))}", file=sys.stderr)
        return EXIT_ERROR
    if not 0 <= args.steps <= MAX_REQUEST_STEPS:
        print(f"traceml capture: error: --steps must be 1 to {MAX_REQUEST_STEPS}", file=sys.stderr)
        return EXIT_ERROR
    if run_dir.is_symlink() or not run_dir.is_dir():
        print(f"traceml capture: error: {strip_control(str(run_dir))} is not a run folder", file=sys.stderr)
        return EXIT_ERROR
    try:
        request = ask_capture(run_dir, ranks, args.steps)
    except OSError as error:
        print(f"traceml capture: error: cannot write the request in {run_dir}: {error}", file=sys.stderr)
        return EXIT_ERROR
    who = f"ranks {','.join(map(str, ranks))}" if ranks else "every rank"
    print(f"traceml capture: asked {who} of {run_dir.name} for a capture (request {request.id})")
    if args.wait <= 0:
        return EXIT_OK
    found = _wait(run_dir, request, args.wait)
    for summary in found:
        where = summary.trace_file or f"no trace: {summary.problem}"
        cost = (f" (cost the training thread at most {summary.cost_s:.2f} s"
                + (f", {summary.cost_s / summary.train_s:.1%} of its training so far)" if summary.train_s > 0
                   else ")") if summary.cost_s > 0 else "")
        print(f"  rank {summary.rank}: {summary.label()} steps {list(summary.steps)}: {strip_control(where)}"
              f"{cost}")
    if not found:
        print(f"traceml capture: no capture within {args.wait:g} s (is the job running, with TRACEML_CAPTURE "
              "on? a rank refuses past its limits: see rank-R.capture-status.json)", file=sys.stderr)
        return EXIT_NO_DATA
    return EXIT_OK


def _wait(run_dir: Path, request: CaptureRequest, wait_s: float) -> list[CaptureSummary]:
    """The summaries of ``request``'s captures once they stop arriving (or at the deadline)."""
    deadline = time.monotonic() + wait_s
    found: list[CaptureSummary] = []
    quiet_since = None
    while time.monotonic() < deadline:
        summaries, _ = read_summaries(run_dir)
        mine = [s for s in summaries if s.request_id == request.id]
        if len(mine) > len(found):
            found, quiet_since = mine, time.monotonic()
        if found and ((request.ranks and len(found) >= len(request.ranks))
                      or (quiet_since is not None and time.monotonic() - quiet_since > 2.0)):
            break
        time.sleep(0.1)
    return found
