"""Free loopback ports for tests that start servers (other test runs may share the machine).

Ports are drawn below the kernel's ephemeral range: the OS hands ports of that range to every
``bind(0)`` and outgoing connection (gloo's mesh, other tests), so a port picked there can be taken
before the server binds it (seen: a rank's scrape endpoint refused "address in use"). Under
pytest-xdist each worker draws from its own slice of that band (``PYTEST_XDIST_WORKER``), so two
workers never hand out the same port; within a worker, ports handed out are not handed out again.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

BAND_WIDTH = 12000
"""How many ports below the ephemeral range the tests draw from."""


def free_port(avoid: tuple[int, ...] = ()) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, none of ``avoid`` and none handed out
    before in this process (or by another xdist worker)."""
    return _draw(1, avoid)


def free_port_pair() -> int:
    """A port P such that P and P+1 were both free a moment ago (rank r of a node serves P + local rank)."""
    return _draw(2, ())


def worker_slice() -> range:
    """This process's ports: its xdist worker's share of the band below the ephemeral range."""
    low, _ = _ephemeral_range()
    band_start = max(1024, low - BAND_WIDTH)
    index, count = _worker_index()
    width = (low - 1 - band_start) // count
    start = band_start + index * width
    return range(start, start + width)


def _draw(width: int, avoid: tuple[int, ...]) -> int:
    ports = worker_slice()
    taken = _HANDED_OUT | set(avoid)
    candidates = [p for p in ports[: len(ports) - width + 1] if not set(range(p, p + width)) & taken]
    random.shuffle(candidates)
    for port in candidates[:200]:
        if _all_bindable(range(port, port + width)):
            _HANDED_OUT.update(range(port, port + width))
            return port
    raise RuntimeError(f"no {width} consecutive free ports in {ports}")


def _all_bindable(ports: range) -> bool:
    probes = [socket.socket() for _ in ports]
    try:
        for probe, port in zip(probes, ports, strict=True):
            probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for probe in probes:
            probe.close()


def _worker_index() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker; (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(name[2:]) if name.startswith("gw") else 0
    except ValueError:
        return 0, 1
    return (index, count) if 0 <= index < count else (0, 1)


_HANDED_OUT: set[int] = set()
"""Ports already given to this process's tests (not bound until their servers start)."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
