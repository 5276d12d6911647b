"""Whether a run folder may take this launch: one run id, one run, unless ``--resume`` says otherwise.

A folder that already holds another launch's data would be merged with this one's (its steps, its
manifest, its statistics), and the diagnosis would describe neither run. ``traceml run`` refuses it
with one line. The exceptions: ``--resume`` (the user says it is the same run), and the restarts
torchrun makes of the same job (``--max-restarts``) inside one launch, which never come back here.
On a multi-node job the nodes share the folder when the runs folder is shared, so only this node's
own ranks' files count as another run's.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from traceml_otel import contract as c
from traceml_otel.errors import SettingsError

_RANK_FILE = re.compile(r"rank-(\d{1,9})\.")
MAX_ENTRIES = 100_000
"""The most folder entries looked at (a folder with more is refused as it is)."""


def refuse_reused_folder(run_dir: Path, nnodes: int, node_rank: int, nproc_per_node: int) -> None:
    """Raise :class:`SettingsError` (one line) when ``run_dir`` holds data of an earlier launch of this
    node: a manifest (one node), or a file of one of this node's ranks."""
    try:
        entries = list(itertools.islice(run_dir.iterdir(), MAX_ENTRIES + 1))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise SettingsError(f"{run_dir} exists and is not a folder; choose another --run-id") from None
    ours = range(node_rank * nproc_per_node, (node_rank + 1) * nproc_per_node)
    found = ""
    for entry in entries:
        match = _RANK_FILE.match(entry.name)
        if (match and int(match[1]) in ours) or (nnodes == 1 and entry.name == c.MANIFEST_FILE):
            found = entry.name
            break
    if found or len(entries) > MAX_ENTRIES:
        shown = "".join(ch if ch.isprintable() else "?" for ch in str(run_dir))
        raise SettingsError(f"run folder {shown} already holds another run's data ({found or 'many files'}); "
                            "pass a new --run-id, or --resume to add to that run")
