"""A job that fails once and is restarted by torchrun (``traceml run --max-restarts 1``).

Attempt 0 checkpoints after steps 4 and 8 (a file holding the step count) and fails after step 10.
Attempt 1 loads the checkpoint, says so with ``traceml.resume_from(8)``, and redoes steps 9 and 10
before going on to step 14. Each step takes ``STEP_S``; nothing imports torch in the workers, so
an attempt starts in a fraction of a second. The script writes the seconds each attempt's
steps took into ``$RESTART_OUT.attempt-A.json`` (the test's truth).
"""

import json
import os
import time
from pathlib import Path

import traceml_otel as traceml

STEP_S, STEPS, FAIL_AFTER, EVERY = 0.1, 14, 10, 4
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
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
    if attempt == 0 and step + 1 == FAIL_AFTER:
        Path(f"{os.environ['RESTART_OUT']}.attempt-{attempt}.json").write_text(json.dumps({"took": took}))
        raise SystemExit("simulated failure after step 10: torchrun restarts the job")
Path(f"{os.environ['RESTART_OUT']}.attempt-{attempt}.json").write_text(json.dumps({"took": took}))
