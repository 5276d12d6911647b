"""Hostile inputs against the analyzer and the launcher (issue 21), with time and peak memory.

    python benchmarks/hostile_inputs.py            # all four parts
    python benchmarks/hostile_inputs.py --part tempo

Parts:

- ``devfull``: ``/dev/full`` over rank 0's span file while ``traceml run`` runs (a bind mount when
  this process may mount, else a symbolic link put in the file's place): the script's exit code, the
  account, and the launcher's peak RSS (``VmHWM`` of the ``traceml run`` process, polled).
- ``special``: ``traceml analyze`` on a FIFO, a 10 GB sparse file and a ``/dev/zero`` link, each under a
  2 GB address-space limit (``RLIMIT_AS``): exit code, seconds, the line it printed.
- ``tempo``: a Tempo answer of 30 MiB and of 200 MiB of ``{}`` items (served by a separate process):
  the analyzer's exit code, its line, and its peak RSS (``/usr/bin/time -f %M``).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEADY = REPO / "tests" / "launch" / "scripts" / "steady_loop.py"
CLI = [sys.executable, "-m", "traceml_otel.cli"]
_TEMPO_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = b'{"traces": [' + b"{}," * (int(sys.argv[1]) // 3) + b"{}]}"
class Answer(BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _env(runs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(runs), PYTHONUNBUFFERED="1")
    return env


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def devfull(scratch: Path) -> None:
    runs = scratch / "runs"
    command = [*CLI, "run", "--run-id", "devfull", str(STEADY), "--", "--steps", "400", "--sleep", "0.01",
               "--exit-code", "3"]
    launcher = subprocess.Popen(command, env=_env(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    target = runs / "devfull" / "rank-0.traces.jsonl"
    how, peak = "", 0
    while launcher.poll() is None:
        peak = max(peak, _vm_hwm_kib(launcher.pid) or 0)
        if not how and target.exists() and target.stat().st_size > 0:
            mounted = subprocess.run(["mount", "--bind", "/dev/full", str(target)], capture_output=True)
            if mounted.returncode == 0:
                how = "bind mount of /dev/full over rank-0.traces.jsonl"
            else:
                target.unlink()
                target.symlink_to("/dev/full")
                how = "symbolic link to /dev/full in place of rank-0.traces.jsonl (mount refused)"
        time.sleep(0.05)
    out, err = launcher.communicate()
    if how.startswith("bind"):
        subprocess.run(["umount", str(target)], capture_output=True)
    print(f"== devfull ({how or 'not planted: the run ended first'})")
    print(f"traceml run exit code {launcher.returncode} (the script's own: 3); launcher peak RSS "
          f"{peak / 1024:.0f} MiB")
    print("\n".join(line for line in out.splitlines() if "completed" not in line)[-2500:])
    print("-- stderr (traceml lines):")
    print("\n".join(line for line in err.splitlines() if line.startswith("traceml"))[-1500:])


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def special(scratch: Path) -> None:
    fifo, sparse, zero = scratch / "fifo.jsonl", scratch / "sparse.jsonl", scratch / "zero.jsonl"
    os.mkfifo(fifo)
    with sparse.open("wb") as handle:
        handle.truncate(10 << 30)
    zero.symlink_to("/dev/zero")
    print("== special files, traceml analyze under a 2 GB address-space limit")
    for path in (fifo, sparse, zero):
        started = time.monotonic()
        result = subprocess.run([*CLI, "analyze", str(path)], capture_output=True, text=True, timeout=60,
                                preexec_fn=_limited)
        took = time.monotonic() - started
        said = [line for line in (result.stderr + result.stdout).splitlines()
                if "not a regular file" in line or "NUL bytes" in line]
        line = " ".join(said[0].split()) if said else "?"
        print(f"{path.name}: exit {result.returncode} in {took:.2f} s: {line}")


def tempo() -> None:
    print("== hostile Tempo answers of {} items, traceml analyze --tempo (default limits)")
    for mib in (30, 200):
        server = subprocess.Popen([sys.executable, "-c", _TEMPO_SERVER, str(mib << 20)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            started = time.monotonic()
            result = subprocess.run(["/usr/bin/time", "-f", "peak_rss_kib %M", *CLI, "analyze", "--tempo",
                                     f"http://127.0.0.1:{port}", "--run-id", "r", "--since", "1799999990",
                                     "--until", "1799999991"], capture_output=True, text=True, timeout=300)
            took = time.monotonic() - started
        finally:
            server.kill()
        lines = result.stderr.strip().splitlines()
        peak = next((int(line.split()[1]) for line in lines if line.startswith("peak_rss_kib")), 0)
        said = next((line for line in lines if line.startswith("traceml analyze")), "?")
        print(f"{mib} MiB answer: exit {result.returncode} in {took:.1f} s, peak RSS {peak / 1024:.0f} MiB: "
              f"{said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("devfull", "special", "tempo", "all"), default="all")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="traceml-hostile-"))
    if args.part in ("devfull", "all"):
        devfull(scratch)
    if args.part in ("special", "all"):
        special(scratch)
    if args.part in ("tempo", "all"):
        tempo()


if __name__ == "__main__":
    main()
