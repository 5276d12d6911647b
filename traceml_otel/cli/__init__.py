"""The ``traceml`` command line: the only layer that parses arguments, sets exit codes and writes files.

- ``entry``: the ``traceml`` parser and the dispatch to a subcommand (``main``).
- ``run``: ``traceml run``, the launcher's options and the end-of-run diagnosis.
- ``analyze``: ``traceml analyze`` and the end-of-run report files.
- ``compare``: ``traceml compare``.
- ``stack``: ``traceml stack render``.
- ``common``: exit codes, the error line, writing a report, the step-window options.

The libraries below it (``analyze``, ``report``, ``launch``, ``stack``) never import it.
"""

from __future__ import annotations

from traceml_otel.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
