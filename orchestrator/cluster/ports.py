"""Free TCP ports for servers this package (or its tests) starts on one machine."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int, host: str = "", avoid: frozenset[int] = frozenset()) -> list[int]:
    """`count` distinct ports that nothing listens on now and that are not in `avoid` (ports
    chosen earlier for a server that has not bound them yet). The sockets stay open until all
    are chosen: closed one at a time, the kernel may hand the same port out twice, and a Ray
    node given one port for two of its servers refuses to start."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port not in avoid:
                ports.append(port)
        return ports


def free_port(host: str = "", avoid: frozenset[int] = frozenset()) -> int:
    return free_ports(1, host, avoid)[0]
