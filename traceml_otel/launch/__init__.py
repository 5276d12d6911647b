"""Launch: ``traceml run`` as a library (``run.launch``) and the end-of-run telemetry report."""
