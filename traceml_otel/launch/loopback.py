"""Keep a single-node run's rendezvous on 127.0.0.1.

``torch.distributed.run --standalone`` hosts its rendezvous and worker stores (``TCPStore``) on
every interface (``*:PORT``), reachable from the network for the length of the run. On one node
nothing outside the machine needs them. While ``traceml run`` runs torchrun in this process,
:func:`loopback_tcp_stores` makes every store that this process *hosts* listen on a socket bound
to 127.0.0.1 (``TCPStore``'s ``master_listen_fd``), and ``--local-addr 127.0.0.1`` makes the ranks
connect there. Clients and multi-node runs are untouched.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

LOOPBACK = "127.0.0.1"
_LISTEN_BACKLOG = 2048


def _hosting(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    is_master = kwargs.get("is_master", args[3] if len(args) > 3 else False)
    return bool(is_master) and kwargs.get("master_listen_fd") is None


@contextlib.contextmanager
def loopback_tcp_stores() -> Iterator[None]:
    """Within the block, a ``TCPStore`` this process hosts listens on 127.0.0.1 only."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    real = dist.TCPStore

    def tcp_store(*args: Any, **kwargs: Any) -> Any:
        if not _hosting(args, kwargs):
            return real(*args, **kwargs)
        port = int(kwargs["port"] if "port" in kwargs else args[1])
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((LOOPBACK, port))
            listener.listen(_LISTEN_BACKLOG)
        except OSError:
            listener.close()
            raise RuntimeError(_address_in_use()) from None  # torch retries another port on this text
        fd = listener.detach()  # the store owns the descriptor from here
        try:
            return real(*args, **dict(kwargs, master_listen_fd=fd))
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    dist.TCPStore, c10d_rendezvous_backend.TCPStore = tcp_store, tcp_store
    try:
        yield
    finally:
        dist.TCPStore, c10d_rendezvous_backend.TCPStore = real, real


def _address_in_use() -> str:
    try:
        from torch.distributed.elastic.utils.distributed import _ADDRESS_IN_USE
    except ImportError:
        return "Address already in use"
    return str(_ADDRESS_IN_USE)
