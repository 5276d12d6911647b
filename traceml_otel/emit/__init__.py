"""Emit: the pipe to a per-rank emitter process, which turns step records into OTel spans and
metrics, writes the local OTLP-JSON copy and exports over OTLP.

Training side: ``channel.EmitterChannel``. Emitter side: ``worker.main``.
"""
