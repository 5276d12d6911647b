"""``python -m traceml_otel.cli``: the ``traceml`` command."""

from __future__ import annotations

import sys

from traceml_otel.cli.entry import main

if __name__ == "__main__":
    sys.exit(main())
