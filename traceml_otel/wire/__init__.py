"""Typed records that cross a process or file boundary, each with its encoder and decoder beside it.

This package imports only the standard library, :mod:`traceml_otel.contract`,
:mod:`traceml_otel.sanitize` and :mod:`traceml_otel.step_records` (standard library only too), so
the analysis-only install (no torch, grpc or OTel SDK) can read every record, and capture and emit
depend on it, never on each other.

Files:

- :mod:`traceml_otel.wire.manifest`: ``manifest.json``, the run
  (version :data:`~traceml_otel.wire.manifest.MANIFEST_VERSION`).
- :mod:`traceml_otel.wire.export_stats`: ``rank-R.export.json``, what one rank's emitter did
  (version :data:`~traceml_otel.wire.export_stats.EXPORT_STATS_VERSION`); its reader folds in
- :mod:`traceml_otel.wire.handoff`: ``rank-R.handoff.json``, the trainer's word on what it handed an
  emitter that did not report back (died, stopped or hung).
- :mod:`traceml_otel.wire.bounded_file`: how every file we did not write ourselves is read: regular
  files only, never blocking (FIFOs, devices, sockets refused with one line), lines bounded, NUL runs
  and sparse holes skipped. New per-run records (a hang record, say) should read through it.
- :mod:`traceml_otel.wire.hang_record`: ``rank-R.hang.json``, one rank's hang; and
  :mod:`traceml_otel.wire.hang_verdict`: the ranks' records combined into one verdict (culprits,
  their ``file:line``, the waiting ranks), shared by the launcher, the emitter and the analyzer.

The trainer -> emitter stream (one pipe per rank; version :data:`~traceml_otel.wire.frames.WIRE_VERSION`,
carried in the hello and checked by the emitter, which refuses another version and reports the
rank's steps as dropped):

- :mod:`traceml_otel.wire.frames`: the length-prefixed JSON frames (``encode_frame``, ``encode_steps``,
  ``FrameBuffer``, ``WireError``, ``MAX_FRAME_BYTES``).
- :mod:`traceml_otel.wire.hello`: ``Hello``, the first frame: rank identity, outputs, shutdown
  deadline, clock anchor.
- :mod:`traceml_otel.wire.control`: the control records beside the hello and the steps: ``DeviceInfo``
  (the ``device`` frame), ``Bye`` (the ``bye`` frame) and ``LocalReport`` (the emitter's one-line
  answer on its stdout: what the local copy holds, or why it refused the stream).
- :mod:`traceml_otel.wire.step_row`: ``StepRow`` (with ``PhaseRow`` and ``CollectiveRow``), one
  completed step as a list with named slots, built by the recorder on the training thread;
  ``decode_step`` turns it into a ``records.StepRecord`` on the emitter side. Slots are only ever
  appended.
"""
