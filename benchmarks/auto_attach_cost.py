"""What zero-code tracing costs a process that imports neither framework (CPU).

    .venv/bin/python benchmarks/auto_attach_cost.py

1. The import finder's cost per import of a module it does not watch (a dictionary lookup), timed
   over a million calls against an empty function call measured in the same run.
2. Python start-up with the start-up hook on ``PYTHONPATH`` (as ``traceml run`` sets it) against
   without, best of 15 runs each: a process that does not attach (``python -c``, as a DataLoader
   worker starts), the script's process with an empty script (the hook loads, installs the finder
   and hands over) and with one that imports 40 standard-library modules (each passes the finder).
3. The ``traceml-otel-auto.pth`` line with ``TRACEML_AUTO`` unset (what every Python start-up pays
   once the package is installed): the line alone, and ``site.addsitedir`` of a folder holding only
   that file against an empty folder (listing, reading and running it), best of many.
4. ``TRACEML_AUTO=1`` in a process that does not attach (``python -c pass``: the hook loads its
   filter and stops) against unset, interleaved, best of 15.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traceml_otel.integrations.auto_attach import _PostImportFinder
from traceml_otel.launch.bootstrap import BOOTSTRAP_DIR

IMPORTS = ("import json, email.parser, http.client, xml.dom.minidom, csv, decimal, fractions, statistics, "
           "sqlite3, zipfile, tarfile, gzip, bz2, lzma, uuid, logging.handlers, argparse, pathlib, shutil, "
           "tempfile, textwrap, difflib, pprint, dataclasses, enum, typing, asyncio, concurrent.futures, "
           "urllib.request, html.parser, wave, colorsys, calendar, heapq, bisect, queue, sched, "
           "contextvars, pickletools, optparse")


def per_call_ns(fn, calls: int = 1_000_000) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(calls):
            fn("some.module.name")
        best = min(best, (time.perf_counter_ns() - started) / calls)
    return best


def startup_ms(script: Path, hooked: bool, runs: int = 15, *args: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    if hooked:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), env.get("PYTHONPATH", "")) if p)
        env["TRACEML_BOOT_SCRIPT"] = str(script)  # as traceml run sets it
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, *(args or (str(script),))], env=env, check=True)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


PTH = Path(__file__).resolve().parents[1] / "traceml_otel" / "launch" / "traceml-otel-auto.pth"


def pth_cost_us() -> tuple[float, float]:
    """(the .pth line alone, reading and running the file at start-up) in microseconds, variable unset."""
    import site

    env_before = os.environ.pop("TRACEML_AUTO", None)
    line = compile(PTH.read_text().strip(), "pth", "exec")
    best_line = min(_timed(lambda: exec(line), 100_000) for _ in range(5))
    with tempfile.TemporaryDirectory() as with_pth, tempfile.TemporaryDirectory() as empty:
        Path(with_pth, PTH.name).write_text(PTH.read_text())
        saved = list(sys.path)
        times = {with_pth: float("inf"), empty: float("inf")}
        for _ in range(200):  # interleaved
            for folder in times:
                times[folder] = min(times[folder], _timed(lambda f=folder: site.addsitedir(f, set()), 1))
                sys.path[:] = saved
    if env_before is not None:
        os.environ["TRACEML_AUTO"] = env_before
    return best_line, times[with_pth] - times[empty]


def _timed(fn, calls: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - started) / calls / 1e3


def variable_startup_ms(runs: int = 15) -> tuple[float, float]:
    """Best ``python -c pass`` start-up with TRACEML_AUTO unset and set to 1, interleaved."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    best = {"unset": float("inf"), "set": float("inf")}
    for _ in range(runs):
        for label, env in (("unset", base), ("set", {**base, "TRACEML_AUTO": "1"})):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            best[label] = min(best[label], (time.perf_counter() - started) * 1e3)
    return best["unset"], best["set"]


def main() -> None:
    finder = _PostImportFinder({"transformers.trainer": print, "torch": print})

    def empty(name: str) -> None:
        return None

    bare, lookup = per_call_ns(empty), per_call_ns(finder.find_spec)
    print(f"finder per unwatched import: {lookup:.0f} ns (empty call {bare:.0f} ns, "
          f"added {lookup - bare:.0f} ns)")
    with tempfile.TemporaryDirectory() as folder:
        empty_script, imports = Path(folder, "train.py"), Path(folder, "imports.py")
        empty_script.write_text("pass\n")
        imports.write_text(IMPORTS + "\n")
        cases = (
            ("worker (python -c pass)", empty_script, ("-c", "pass")),
            ("training script: empty", empty_script, ()),
            ("training script: 40 stdlib imports", imports, ()),
        )
        for label, script, args in cases:
            plain, hooked = startup_ms(script, False, 15, *args), startup_ms(script, True, 15, *args)
            print(f"{label:<36} without {plain:6.1f} ms  with the hook {hooked:6.1f} ms  "
                  f"added {hooked - plain:+.1f} ms")
    line_us, file_us = pth_cost_us()
    print(f".pth line, TRACEML_AUTO unset: {line_us:.2f} us; the file read and run at start-up: "
          f"{file_us:+.1f} us")
    unset, set_ = variable_startup_ms()
    print(f"python -c pass: TRACEML_AUTO unset {unset:6.1f} ms  =1 {set_:6.1f} ms  "
          f"added {set_ - unset:+.1f} ms")


if __name__ == "__main__":
    main()
