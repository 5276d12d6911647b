"""``traceml run``: launch a training script through ``torch.distributed.run`` and report.

All ranks get one run id (``TRACEML_RUN_ID``) and the caller's ``OTEL_*`` environment.
The launcher writes ``manifest.json`` around the run and returns the script's exit code.
``torch.distributed.run`` runs in this process, so its elastic agent passes SIGTERM and
Ctrl-C on to every rank, whose telemetry flushes before it exits. One process on one node
skips the agent (:mod:`traceml_otel.launch.single`): same environment, signals and exit codes,
about 2.5 s less start-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.capture.clock_anchor import wall_anchor_ns
from traceml_otel.capture.time_ledger import first_seen, own_start_time
from traceml_otel.errors import SettingsError
from traceml_otel.launch.bootstrap import auto_attach_env
from traceml_otel.launch.child_watch import FirstFailure, first_failure_of, watch_torchrun_failures
from traceml_otel.launch.exit_endpoint import serve_first_failure
from traceml_otel.launch.hang_monitor import EXIT_HANG, HangMonitor
from traceml_otel.launch.live_view import announce, start_live_view
from traceml_otel.launch.loopback import LOOPBACK, loopback_tcp_stores
from traceml_otel.launch.run_folder import refuse_reused_folder
from traceml_otel.launch.single import run_single_process, single_process_command
from traceml_otel.run_identity import checked_name, new_run_id, safe_name
from traceml_otel.sanitize import redact_argv
from traceml_otel.settings import (
    SHUTDOWN_TIMEOUT_DEFAULT_S,
    TRACEML_AUTO_ATTACH,
    TRACEML_JOB,
    TRACEML_LAUNCHER,
    TRACEML_LAUNCHER_PID,
    TRACEML_RUN_ID,
    TRACEML_RUN_NAME,
    TRACEML_RUNS_DIR,
    explicit_job,
    explicit_run_id,
    runs_dir,
    scheduler_job,
    shutdown_timeout_s,
)
from traceml_otel.wire.manifest import Manifest, write_manifest


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    """What ``traceml run`` was asked to do."""

    script: str
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    run_name: str | None = None
    run_id: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    hang_action: str = "report"
    """What to do when the ranks hang: ``report`` (a line on stderr) or ``terminate`` (end the job)."""
    module: bool = False
    """``script`` is a module name, run as ``python -m`` (torchrun's ``--module``)."""
    max_restarts: int = 0
    """torchrun's ``--max-restarts``: a failed attempt restarts every rank up to this many times."""
    live: str = "off"
    """The live view (``launch/live_view.py``): ``auto``, ``panel``, ``lines`` or ``off``."""
    live_interval_s: float = 30.0

    @property
    def default_name(self) -> str:
        """The run name when none is given: the script's stem, or a module's last part."""
        return self.script.rpartition(".")[2] if self.module else Path(self.script).stem
    auto_attach: bool = True
    """Zero-code tracing in the ranks (framework callbacks, inferred steps): see launch/bootstrap.py."""
    resume: bool = False
    """Write into a run folder that already holds data of this run id (``--resume``)."""


def resolve_run_id(options: LaunchOptions, env: dict[str, str]) -> str:
    """One id for every rank: explicit, from the environment, or generated.

    Nodes of a multi-node job launch separately, so there the id is derived from what they
    share (run name, master address and port) unless given.
    """
    if options.run_id:
        return checked_name("--run-id", options.run_id)
    explicit = explicit_run_id(env)
    if explicit:
        return checked_name(TRACEML_RUN_ID, explicit)
    name = (checked_name("--run-name", options.run_name) if options.run_name
            else safe_name(options.default_name))
    if options.nnodes > 1:
        seed = f"{name}:{options.master_addr}:{options.master_port}"
        run_id = f"{name[:100]}-{hashlib.sha256(seed.encode()).hexdigest()[:12]}"  # a safe name, as given
        print(f"traceml: run id {run_id} is derived from the run name and master address, so a later run "
              "with the same ones reuses it; pass the same --run-id on every node to tell runs apart",
              file=sys.stderr, flush=True)
        return run_id
    return new_run_id(name)


def torchrun_arguments(options: LaunchOptions) -> list[str]:
    """The ``torch.distributed.run`` command-line arguments for ``options``."""
    arguments = [f"--nproc-per-node={options.nproc_per_node}"]
    if options.nnodes > 1:
        arguments += [
            f"--nnodes={options.nnodes}", f"--node-rank={options.node_rank}",
            f"--master-addr={options.master_addr}", f"--master-port={options.master_port}",
        ]
    else:  # one node: the rendezvous stays on the loopback interface (see launch/loopback.py)
        arguments += ["--standalone", f"--local-addr={LOOPBACK}"]
    if options.max_restarts:
        arguments.append(f"--max-restarts={options.max_restarts}")
    return [*arguments, *(["--module"] if options.module else []), options.script, *options.script_args]


def run_torchrun(arguments: list[str], on_failure: Callable[[FirstFailure], None] | None = None,
                 rank_offset: int = 0) -> int:
    """Run ``torch.distributed.run`` in this process; the exit code of the first failing rank.

    The elastic agent forwards SIGTERM/SIGINT to every rank (whose telemetry flushes) and
    raises here; a rank killed by a signal gives 128 + the signal number. ``on_failure`` hears the
    first failure the agent found, before it stops the other ranks (launch/child_watch.py).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    loopback = loopback_tcp_stores() if "--standalone" in arguments else contextlib.nullcontext()
    watch = (watch_torchrun_failures(on_failure, rank_offset) if on_failure is not None
             else contextlib.nullcontext())
    try:
        with loopback, watch:
            run(parse_args(arguments))
    except ChildFailedError as error:
        first = first_failure_of(error.failures)
        if first is not None:
            return first.exit_code
        _, failure = error.get_first_failure()
        return exit_code_of(failure.exitcode)
    except SignalException as error:
        return 128 + int(error.sigval)
    return 0


def save_manifest(run_dir: Path, manifest: Manifest) -> bool:
    """Write ``manifest.json`` (:func:`traceml_otel.wire.manifest.write_manifest`). A failure (read-only
    or full disk) is said, never raised: the run goes on without it."""
    try:
        write_manifest(run_dir, manifest)
    except OSError as error:
        print(f"traceml: cannot write {run_dir / c.MANIFEST_FILE} ({type(error).__name__}: {error}); "
              "training goes on without it", file=sys.stderr, flush=True)
        return False
    return True


def ranks_shutdown_timeout_s(env: dict[str, str] | None = None) -> float:
    """``TRACEML_SHUTDOWN_TIMEOUT_S`` read by the ranks' own parser (:func:`traceml_otel.settings.
    shutdown_timeout_s`); the default when unusable (the ranks then say so and export nothing)."""
    try:
        return shutdown_timeout_s(env)
    except SettingsError:
        return SHUTDOWN_TIMEOUT_DEFAULT_S


def end_status_of(code: int) -> str:
    """The manifest's ``end_status`` for a shell-style exit code: ``ok``, a signal, or the code."""
    if code == 0:
        return "ok"
    if 128 < code < 128 + 65:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"{name} (Ctrl-C)" if name == "SIGINT" else name
    return f"exit code {code}"


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + signal number for a child killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


def launch(options: LaunchOptions) -> tuple[int, Path]:
    """Run the script under ``torch.distributed.run``; returns (exit code, run directory)."""
    # The launch: start-up counts from this process's own start (never a parent shell's: see
    # own_start_time); the end is that plus monotonic time, so a wall-clock step moves no duration.
    launched = own_start_time("self", first_seen()) or time.time()
    anchor = wall_anchor_ns() / 1e9
    env = {**os.environ, **options.extra_env}
    run_id = resolve_run_id(options, env)
    run_name = (checked_name("--run-name", options.run_name) if options.run_name
                else safe_name(options.default_name))
    runs = runs_dir(env)  # absolute, resolved here: the ranks write there whatever their cwd
    run_dir = runs / run_id  # the ranks' own folder: no link followed
    if not options.resume:
        refuse_reused_folder(run_dir, options.nnodes, options.node_rank, options.nproc_per_node)
    arguments = torchrun_arguments(options)
    single = options.nproc_per_node == 1 and options.nnodes == 1 and not options.max_restarts  # no agent
    launcher = single_process_command(options.script, options.script_args, options.module) if single else [
        "torch.distributed.run", *arguments]
    manifest = Manifest(
        run_id=run_id,
        run_name=run_name,
        command=tuple(redact_argv([*(["-m"] if options.module else []), options.script,
                                   *options.script_args])),  # no tokens in readable files
        launcher=tuple(redact_argv(launcher)),
        world_size=options.nproc_per_node * options.nnodes,
        nnodes=options.nnodes,
        node_rank=options.node_rank,
        start_time=launched,
    )
    save_manifest(run_dir, manifest)
    attach = auto_attach_env(env, options.script) if options.auto_attach else {TRACEML_AUTO_ATTACH: "0"}
    saved = {name: os.environ.get(name)
             for name in (TRACEML_RUN_ID, TRACEML_RUN_NAME, TRACEML_LAUNCHER, TRACEML_LAUNCHER_PID,
                          TRACEML_JOB, TRACEML_RUNS_DIR, *options.extra_env, *attach)}
    os.environ.update({TRACEML_RUN_ID: run_id, TRACEML_RUN_NAME: run_name, TRACEML_LAUNCHER: "traceml-run",
                       TRACEML_RUNS_DIR: str(runs),
                       **options.extra_env, **attach,
                       TRACEML_LAUNCHER_PID: str(os.getpid())})  # ranks stop if we die
    if options.run_name and not explicit_job() and not scheduler_job(os.environ):
        os.environ[TRACEML_JOB] = options.run_name  # a named run is a job (the scheduler's identity first)
    monitor = HangMonitor(run_dir, manifest.world_size or 1, options.hang_action)
    announce()
    view = start_live_view(run_dir, run_id, options.live, options.live_interval_s)
    monitor.start()
    first: list[FirstFailure] = []

    def failed(found: FirstFailure) -> None:  # in the agent, before it stops the other ranks
        if not first and not monitor.terminated:  # the first attempt's (a hang's end is no failure)
            first.append(found)
            save_manifest(run_dir, replace(manifest, first_failure_rank=found.rank, first_failure=found.how))

    rank_env = dict(os.environ)  # what the ranks were given (the first failure's endpoint reads it)
    try:
        if single:
            code = run_single_process(options.script, options.script_args, os.environ, run_id, options.module)
            if code and code - 128 not in (signal.SIGTERM, signal.SIGINT) and not monitor.terminated:
                first.append(FirstFailure(0, end_status_of(code), code))
        else:
            code = run_torchrun(arguments, failed, options.node_rank * options.nproc_per_node)
        if monitor.terminated:
            code = EXIT_HANG
    finally:
        view.stop()
        monitor.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    status = "hung: ended by --hang-action terminate" if monitor.terminated else end_status_of(code)
    ended = replace(manifest, end_time=anchor + time.perf_counter(), exit_code=code, end_status=status)
    if first:
        ended = replace(ended, first_failure_rank=first[0].rank, first_failure=first[0].how)
    save_manifest(run_dir, ended)
    if first and not monitor.terminated:  # the ranks' endpoints are closed: say it on the first one's port
        serve_first_failure(first[0], rank_env, options.node_rank * options.nproc_per_node)
    return code, run_dir
