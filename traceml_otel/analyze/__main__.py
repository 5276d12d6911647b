"""``python -m traceml_otel.analyze``: the ``traceml analyze`` command on its own."""

from __future__ import annotations

import argparse
import sys

from traceml_otel.analyze.commands import add_analyze_arguments, run_analyze


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m traceml_otel.analyze", description="Diagnose a run from its spans."
    )
    add_analyze_arguments(parser)
    return run_analyze(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
