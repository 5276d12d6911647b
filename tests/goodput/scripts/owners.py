"""A tiny loop for the time-owner tests (``tests/goodput/test_owners.py``); no torch, so it starts fast.

20 steps of ~10 ms, then ``outside_step("evaluation")`` for ``OWNERS_OUTSIDE_S`` seconds (default 0),
then 20 more steps. With ``OWNERS_FAKETIME_LIB`` (libfaketime) and ``OWNERS_FAKETIME_FILE``, the
process re-executes itself under libfaketime with the monotonic clock left real, and steps the wall
clock by ``OWNERS_JUMP`` (default ``+3600``) inside the evaluation: an NTP step or a resumed VM. The
emitter (a child) does not inherit it. Waits use ``Event.wait``: libfaketime 0.9.10 with a real
monotonic clock fails ``time.sleep`` (``clock_nanosleep``) with EINVAL. Writes the evaluation's
monotonic seconds (read inside the block) to ``$OWNERS_OUT`` (the test's truth).
"""

import os
import sys
import threading
import time

LIB, CLOCK_FILE = os.environ.get("OWNERS_FAKETIME_LIB"), os.environ.get("OWNERS_FAKETIME_FILE")
if LIB and CLOCK_FILE and os.environ.get("LD_PRELOAD") != LIB:
    with open(CLOCK_FILE, "w") as clock:
        clock.write("+0\n")
    os.execve(sys.executable, [sys.executable, *sys.argv], {
        **os.environ, "LD_PRELOAD": LIB, "FAKETIME_TIMESTAMP_FILE": CLOCK_FILE, "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
os.environ.pop("LD_PRELOAD", None)  # this process only

import traceml_otel as traceml  # noqa: E402

wait = threading.Event().wait
traceml.init()
for _ in range(20):
    with traceml.trace_step():
        wait(0.01)
with traceml.outside_step("evaluation"):
    began = time.perf_counter()
    if CLOCK_FILE and LIB:
        with open(CLOCK_FILE, "w") as clock:
            clock.write(os.environ.get("OWNERS_JUMP", "+3600") + "\n")
    wait(float(os.environ.get("OWNERS_OUTSIDE_S", "0")))
    took = time.perf_counter() - began  # inside the block: at most what the block measures
for _ in range(20):
    with traceml.trace_step():
        wait(0.01)
if os.environ.get("OWNERS_OUT"):
    with open(os.environ["OWNERS_OUT"], "w") as out:
        out.write(f"{took}\n")
