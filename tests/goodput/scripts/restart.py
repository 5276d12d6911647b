"""A job that fails once and is restarted by torchrun (``traceml run --max-restarts 1``).

Attempt 0 checkpoints after steps 4 and 8 (a file holding the step count) and fails after step 10.
Attempt 1 loads the checkpoint, says so with ``traceml.resume_from(8)``, and redoes steps 9 and 10
before going on to step 14. Each step takes ``STEP_S``; nothing imports torch in the workers, so
an attempt starts in a fraction of a second. The script writes the seconds each attempt's
steps took into ``$RESTART_OUT.attempt-A.json`` (the test's truth).

With ``RESTART_FAILURES=2`` (``--max-restarts 2``) attempt 1 fails too, after step 13 (checkpoint at
12), and attempt 2 resumes from 12, redoing step 13. Each attempt also writes, on the system-wide
monotonic clock, its process's start (``forked``, from ``/proc``) and when its last step ended before failing
(``failed``): each restart's gap is one attempt's ``failed`` to the next's ``forked``.
"""

import json
import os
import time
from pathlib import Path

import traceml_otel as traceml
from traceml_otel.capture.time_ledger import process_start_time

STEP_S, STEPS, EVERY = 0.1, 14, 4
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
forked = time.monotonic() - (time.time() - (process_start_time() or time.time()))
FAIL_AFTER = {0: 10, 1: 13}.get(attempt) if attempt < int(os.environ.get("RESTART_FAILURES", "1")) else None
checkpoint = Path(os.environ["RESTART_OUT"] + ".checkpoint")
traceml.init()
done = int(checkpoint.read_text()) if checkpoint.exists() else 0
if done:
    traceml.resume_from(done)
took = []
for step in range(done, STEPS):
    began = time.time()
    with traceml.trace_step():  # no torch: the worker starts in well under a second
        time.sleep(STEP_S)
    took.append(time.time() - began)
    if (step + 1) % EVERY == 0:
        checkpoint.write_text(str(step + 1))
    if step + 1 == FAIL_AFTER:
        Path(f"{os.environ['RESTART_OUT']}.attempt-{attempt}.json").write_text(
            json.dumps({"took": took, "forked": forked, "failed": time.monotonic()}))
        raise SystemExit(f"simulated failure after step {FAIL_AFTER}: torchrun restarts the job")
Path(f"{os.environ['RESTART_OUT']}.attempt-{attempt}.json").write_text(
    json.dumps({"took": took, "forked": forked}))
