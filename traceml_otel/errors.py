"""The root of every error traceml-otel raises on purpose.

A :class:`TracemlError` says the input, the configuration or a backend's answer cannot be used: a
user's problem, with a message that says what to change. The ``traceml`` command prints it on one
line and exits 2. Any other exception that escapes a command is a bug in traceml-otel: the command
says so, prints the traceback and exits 70 (``cli/common.py`` holds the codes). Each error keeps the
built-in base it had (``ValueError``, ``OSError``, ``RuntimeError``), so callers that catch those
still do.

The types, by where they are raised:
- :class:`UsageError`: options or arguments that do not fit together (CLI, analysis window, time range);
- :class:`SettingsError`: an environment variable with a value we cannot use (``settings.py``,
  ``otlp_choice.py``);
- ``stack.config.StackConfigError``: a ``traceml stack render`` setting we cannot use;
- ``analyze.sources.base.SourceError``: a span or metric source that cannot be read at all;
- ``analyze.sources.step_table.ColumnarUnavailable``: ``--engine columnar`` cannot serve this run;
- ``analyze.otlp_decode.ForeignDocument``: valid JSON that holds no OTLP traces;
- ``report.run_summary.ReportFormatError``: a JSON file that is not a report this version reads;
- ``analyze.compare_noise.NoiseFormatError``: a report's ``noise`` section that is malformed;
- ``wire._json.RecordError``: a record file that is unreadable, corrupt or another record;
- ``wire.bounded_file.RefusedFile``: a path that is not a readable regular file (also an ``OSError``);
- ``wire.frames.WireError`` (and ``wire.hello.WireVersionError``): a corrupt or foreign trainer stream.
"""

from __future__ import annotations


class TracemlError(Exception):
    """Something traceml-otel was given cannot be used; the message says what and how to fix it."""

    multiline = False
    """True when the message is our own lines (paths already stripped of control characters), which
    the CLI prints as they are; otherwise it is joined to one line (messages quote servers and files)."""


class UsageError(TracemlError, ValueError):
    """A request that cannot be carried out as given: options that do not fit together, an empty
    window or time range, an unknown format."""


class SettingsError(TracemlError, ValueError):
    """A traceml or OTel environment variable has a value we cannot use."""
