"""Callbacks for training frameworks that own the loop: Hugging Face ``Trainer`` and Lightning.

Each lives in its own module and imports its framework only when that module is imported:
``traceml_otel.integrations.hf_trainer`` and ``traceml_otel.integrations.lightning_callback``.
Both drive the same capture as the manual API (``trace_step`` and the automatic hooks).
"""
