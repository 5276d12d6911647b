"""Free loopback ports for tests that start servers (other test runs may share the machine)."""

from __future__ import annotations

import socket


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
    """A port P such that P and P+1 were both free a moment ago (rank r of a node serves P + local rank)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")
