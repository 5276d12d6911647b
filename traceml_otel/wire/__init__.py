"""Typed records that cross a process or file boundary, each with its encoder and decoder beside it.

This package imports only the standard library and :mod:`traceml_otel.contract`, so the
analysis-only install (no torch, grpc or OTel SDK) can read every record.

- :mod:`traceml_otel.wire.manifest`: ``manifest.json``, the run
  (version :data:`~traceml_otel.wire.manifest.MANIFEST_VERSION`).
- :mod:`traceml_otel.wire.export_stats`: ``rank-R.export.json``, what one rank's emitter did
  (version :data:`~traceml_otel.wire.export_stats.EXPORT_STATS_VERSION`).
"""
