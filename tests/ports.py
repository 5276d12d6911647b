"""Free loopback ports for tests that start servers (other test runs may share the machine)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port(avoid: tuple[int, ...] = ()) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it), none of ``avoid`` (ports
    handed out already, that their servers have not bound yet)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port


def free_port_pair() -> int:
    """A port P such that P and P+1 were both free a moment ago (rank r of a node serves P + local rank).

    Drawn below the kernel's ephemeral range: the OS hands ports of that range to every ``bind(0)``
    and outgoing connection (gloo's mesh, other tests), so a port picked there can be taken before
    the server binds it (seen: a rank's scrape endpoint refused "address in use").
    """
    low, _ = _ephemeral_range()
    candidates = [p for p in range(max(1024, low - 12000), low - 1) if not {p, p + 1} & _HANDED_OUT]
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        _HANDED_OUT.update((port, port + 1))
        return port
    raise RuntimeError("no two consecutive free ports")


_HANDED_OUT: set[int] = set()
"""Pairs already given to this process's tests (not bound until their servers start)."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
