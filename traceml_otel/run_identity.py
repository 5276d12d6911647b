"""Who this process is: its place in the job, the run's id, the job's identity and the launcher.

:class:`RankIdentity` is where the process sits (torchrun's ``RANK``, ``LOCAL_RANK``, ...). A run id
names one attempt of a job (its local-copy folder, ``traceml.run.id``); the job identity (the
``traceml_job`` label) stays the same when the job restarts under a new run id. All come from what
the launchers give every rank: torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``), the Slurm job
(``SLURM_JOB_NAME``/``SLURM_JOB_ID``), accelerate's markers. traceml-otel's own overrides
(``TRACEML_RUN_ID``, ``TRACEML_JOB``, ``TRACEML_LAUNCHER``) are read in :mod:`traceml_otel.settings`,
the one module that reads ``TRACEML_*`` variables, which passes them in and falls back on these.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.env_values import whole_number
from traceml_otel.errors import SettingsError

MAX_JOB_CHARS = 128
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A run id or run name we accept from a person (``--run-id``, ``--run-name``, ``TRACEML_RUN_ID``,
``TRACEML_RUN_NAME``): one path component of ASCII letters, digits, ``.``, ``_`` and ``-``, starting
with a letter or digit (so never ``.``, ``..`` or an option), at most 128 characters."""


def checked_name(what: str, value: str) -> str:
    """``value`` when it is a :data:`SAFE_NAME`; else :class:`SettingsError` naming ``what`` (printed
    bounded, without control characters)."""
    if SAFE_NAME.fullmatch(value):
        return value
    shown = "".join(ch if ch.isprintable() else "?" for ch in value[:60]) + ("..." if len(value) > 60 else "")
    raise SettingsError(f"{what} {shown!r} is not a safe name: use 1 to 128 ASCII letters, digits, '.', '_' "
                        "or '-', starting with a letter or digit (one folder name, no '/' or '..')")


@dataclass(frozen=True, slots=True)
class RankIdentity:
    """Where this process sits in the job (from the torchrun environment)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    host: str = ""


def rank_identity(env: Mapping[str, str]) -> RankIdentity:
    """Read the torchrun / accelerate rank variables (single process when absent)."""
    return RankIdentity(
        rank=whole_number(env, "RANK", 0, minimum=0),
        local_rank=whole_number(env, "LOCAL_RANK", 0, minimum=0),
        world_size=whole_number(env, "WORLD_SIZE", 1),
        node_rank=whole_number(env, "GROUP_RANK", whole_number(env, "NODE_RANK", 0, minimum=0), minimum=0),
        host=socket.gethostname(),
    )


def safe_name(text: str) -> str:
    """``text`` made a :data:`SAFE_NAME` (other characters become ``-``; ``run`` when nothing is left),
    for names we derive ourselves (a script's file name)."""
    kept = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "-" for ch in text)
    kept = kept.lstrip("._-")[:128]
    return kept or "run"


def new_run_id(run_name: str) -> str:
    """A fresh run id: ``<name>-<UTC time>-<random hex>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_name)[:40] or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(3)}"


def readable_run_id(run_name: str, launcher_id: str) -> str:
    """``<script name>-<launcher's id>``: a folder a person can find, the same on every rank.

    A long id (torchrun's generated UUID) is shortened to its first 8 characters plus 8 hex digits
    of its hash, so two ids never share a folder by truncation.
    """
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in run_name)[:40] or "run"
    ident = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in launcher_id)
    if ident.startswith(safe):
        return ident[:80]
    if len(ident) > 32:
        ident = f"{ident.replace('-', '')[:8]}-{hashlib.sha256(launcher_id.encode()).hexdigest()[:8]}"
    return f"{safe}-{ident}"


def launcher_run_id(env: Mapping[str, str], run_name: str) -> str:
    """The run id when none was given: from torchrun's rendezvous id, else generated."""
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic != "none":
        return readable_run_id(run_name, elastic)
    if elastic == "none":
        # Plain torchrun without --rdzv-id: ranks of one node share the agent (our parent).
        # Multi-node jobs need --rdzv-id or `traceml run` to agree across nodes.
        seed = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}:{os.getppid()}"
        return f"{run_name}-torchrun-{hashlib.sha256(seed.encode()).hexdigest()[:8]}"
    return new_run_id(run_name)


def kubernetes_job(namespace: str, name: str, uid: str) -> str | None:
    """``<namespace>/<Job name>/<first 8 of its UID>`` (the parts known), or None without a name:
    what Kubernetes assigned, so a Job of the same name in another namespace, or a re-created one,
    is another job; a pod restarted by the Job controller keeps it."""
    namespace, name, uid = namespace.strip(), name.strip(), uid.strip()
    if not name:
        return None
    ident = f"{namespace}/{name}" if namespace else name
    return f"{ident}/{uid.replace('-', '')[:8]}" if uid else ident


def launcher_job(env: Mapping[str, str], run_name: str, *, under_traceml_run: bool) -> str | None:
    """The job identity a launcher gives, or None: the Slurm job (``SLURM_JOB_NAME-SLURM_JOB_ID``,
    prefixed with ``SLURM_CLUSTER_NAME/`` where set; a requeued job keeps its id), else torchrun's
    rendezvous id (the same for every elastic restart; not under ``traceml run``, whose standalone
    rendezvous id is new each launch)."""
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    slurm_id, slurm_name = env.get("SLURM_JOB_ID", "").strip(), env.get("SLURM_JOB_NAME", "").strip()
    if slurm_id:
        job = f"{slurm_name}-{slurm_id}" if slurm_name else slurm_id
        cluster = env.get("SLURM_CLUSTER_NAME", "").strip()
        return f"{cluster}/{job}" if cluster else job
    if elastic and elastic != "none" and not under_traceml_run:
        return readable_run_id(run_name, elastic)
    return None


def bounded_job(job: str) -> str:
    """A job identity fit for a label: printable characters only, at most :data:`MAX_JOB_CHARS`."""
    return "".join(ch for ch in job if ch.isprintable())[:MAX_JOB_CHARS]


def detected_launcher(env: Mapping[str, str]) -> str:
    """``accelerate launch``, ``torchrun`` or ``python``, from the variables each launcher sets."""
    if "ACCELERATE_MIXED_PRECISION" in env or "ACCELERATE_DYNAMO_BACKEND" in env:
        return "accelerate launch"
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torchrun"
    return "python"


def script_name() -> str:
    """The running script's name without its suffix (``python`` when there is none)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    return Path(argv0).stem or "python"
