"""How a rank ended, as the contract says it (``traceml.run.exit``), and how long its scrape
endpoint must stay up afterwards so that every scraper sees the end.

The trainer's goodbye carries a status string (``ok``, ``exception ValueError``, ``exit 1``,
``SIGTERM``, ``SIGINT (Ctrl-C)``); :func:`exit_of` turns it into the contract's (status, reason) pair.
:class:`ScrapeLog` remembers when each scraper (by address) scraped, so :func:`linger_seconds`
can cover the longest interval seen: a Prometheus scraping every 60 s, or each of an HA pair,
then scrapes the end marker once before the endpoint closes.
"""

from __future__ import annotations

import re
import threading
import time

from traceml_otel.settings import PROMETHEUS_LINGER_MAX_S as LINGER_MAX_S

LINGER_GRACE_S = 5.0
"""Added to the longest scrape interval seen: a scrape's own duration and the reply."""
MAX_SCRAPERS = 64
_REASON = re.compile(r"[^A-Za-z0-9_.:-]")


def exit_of(status: str) -> tuple[str, str]:
    """(``traceml.exit.status``, ``traceml.exit.reason``) of the goodbye's status string."""
    status = status.strip()
    if status in ("", "ok"):
        return "clean", ""
    if status.startswith("exception "):
        return "exception", _REASON.sub("", status.removeprefix("exception ").strip())[:64] or "Exception"
    if status.startswith("exit "):  # sys.exit(N), N != 0: a failure, never clean
        return "exception", "SystemExit"
    if status.startswith("SIG"):
        return "signal", _REASON.sub("", status.split()[0])[:16]
    return "exception", _REASON.sub("", status.split()[0])[:64] or "Exception"


class ScrapeLog:
    """When each scraper (by its address) last scraped, and the longest interval between two of its
    scrapes. Two scrapers on one address (an HA pair on one host) merge: their interval looks shorter,
    which the configured minimum linger covers."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._longest = 0.0
        self.latest = 0.0
        """Monotonic time of the newest scrape (any scraper); 0 before the first."""
        self._lock = threading.Lock()

    def scraped(self, address: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            previous = self._last.get(address)
            if previous is not None:
                self._longest = max(self._longest, now - previous)
            elif len(self._last) >= MAX_SCRAPERS:
                self._last.pop(next(iter(self._last)))
            self._last[address] = now
            self.latest = now

    @property
    def longest_interval_s(self) -> float:
        with self._lock:
            return self._longest


def linger_line(seconds: float) -> str:
    """The one line said while the scrape endpoint lingers after the end (the run is held open for
    it: a long wait is never silent). Without the ``traceml:`` prefix, for any view to reuse."""
    return f"keeping the metrics endpoint up {max(0.0, seconds):.0f} s for the last scrape"


def linger_seconds(configured_s: float, longest_interval_s: float) -> float:
    """How long after the end the endpoint stays up: at least ``configured_s``, and one longest
    observed scrape interval plus :data:`LINGER_GRACE_S` (at most :data:`LINGER_MAX_S`). 0 when
    ``configured_s`` is 0 (the linger turned off)."""
    if configured_s <= 0:
        return 0.0
    derived = min(LINGER_MAX_S, longest_interval_s + LINGER_GRACE_S) if longest_interval_s > 0 else 0.0
    return max(configured_s, derived)
