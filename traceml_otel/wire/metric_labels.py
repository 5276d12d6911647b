"""The Prometheus label names of the contract's attributes, spelled once.

A resource or metric attribute reaches Prometheus with its dots turned to underscores
(``traceml.run.id`` -> ``traceml_run_id``): the OTLP translation and our own scrape endpoint
(``emit/prometheus_scrape.py``) agree on it. The readers (``analyze/sources/prometheus*.py``,
``cli/top_prometheus.py``) and the scrape endpoint take the names from here.
"""

from __future__ import annotations

from traceml_otel.contract import (
    ATTR_COLLECTIVE_KIND,
    ATTR_COLLECTIVE_SOURCE,
    ATTR_EXIT_REASON,
    ATTR_EXIT_STATUS,
    ATTR_JOB,
    ATTR_PHASE_NAME,
    ATTR_RANK,
    ATTR_RUN_ID,
)


def prometheus_label(attribute: str) -> str:
    """``traceml.run.id`` -> ``traceml_run_id``."""
    return attribute.replace(".", "_")


RUN_LABEL = prometheus_label(ATTR_RUN_ID)
RANK_LABEL = prometheus_label(ATTR_RANK)
JOB_LABEL = prometheus_label(ATTR_JOB)
PHASE_LABEL = prometheus_label(ATTR_PHASE_NAME)
SOURCE_LABEL = prometheus_label(ATTR_COLLECTIVE_SOURCE)
KIND_LABEL = prometheus_label(ATTR_COLLECTIVE_KIND)
EXIT_STATUS_LABEL = prometheus_label(ATTR_EXIT_STATUS)
EXIT_REASON_LABEL = prometheus_label(ATTR_EXIT_REASON)
