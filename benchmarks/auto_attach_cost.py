"""What zero-code tracing costs a process that imports neither framework (CPU).

    .venv/bin/python benchmarks/auto_attach_cost.py

1. The import finder's cost per import of a module it does not watch (a dictionary lookup), timed
   over a million calls against an empty function call measured in the same run.
2. Python start-up with the start-up hook on ``PYTHONPATH`` (as ``traceml run`` sets it) against
   without, best of 15 runs each: a process that does not attach (``python -c``, as a DataLoader
   worker starts), the script's process with an empty script (the hook loads, installs the finder
   and hands over) and with one that imports 40 standard-library modules (each passes the finder).
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


if __name__ == "__main__":
    main()
