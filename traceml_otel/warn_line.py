"""One ``traceml:`` line on the process's stderr: how the training side tells the user something.

A leaf (it imports nothing of ours), so every layer can warn without importing the session.
"""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """One ``traceml:`` line on stderr."""
    print(f"traceml: {message}", file=sys.stderr, flush=True)
