"""Fixtures the emitter's end-to-end tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.otlp_stack import OtlpHttpReceiver, RotelCollector, rotel_stack


@pytest.fixture
def stack() -> Iterator[tuple[OtlpHttpReceiver, RotelCollector]]:
    """A receiver behind a running rotel collector (``tests/integration/otlp_stack.py``)."""
    with rotel_stack() as pair:
        yield pair
