"""Ports for the servers a test starts (MLflow and auth servers, Ray nodes, SLURM daemons,
chromedriver), and ports where nothing listens.

Not orchestrator.cluster.ports' bind(0): the suite's test processes run at once (two pytest-xdist
workers and the SLURM part), and the kernel may hand one port to two of them while neither has
bound it yet. A server that takes seconds to start then lost the port to another worker's, whose
answer the test read as its own (seen in a full run: test_server_auth's probe got a 200 from
another worker's server a second after start, and its own log was empty). Here each test process
takes ports from a band of its own, below the kernel's ephemeral range (where bind(0) and
outgoing connections take theirs), one after another, skipping any port something holds.
"""

from __future__ import annotations

import itertools
import os
import socket

FIRST = 20000  # bands end below 32768, where Linux's ip_local_port_range starts by default
BAND = 1000  # ports per process; a band wraps around (a port in use is skipped)
WORKER_BANDS = 10  # gw0 .. gw9; band 0 is the processes outside xdist (the SLURM and serial parts)


def band(worker: str | None = None) -> range:
    """The band of the test process `worker` names (PYTEST_XDIST_WORKER: gw0, gw1, ...; empty or
    absent outside xdist). The suite's SLURM part, outside xdist, runs beside the workers; the
    serial part, also outside xdist, after them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "") if worker is None else worker
    index = int(worker[2:]) % WORKER_BANDS + 1 if worker.startswith("gw") else 0
    start = FIRST + index * BAND
    return range(start, start + BAND)


_next: itertools.cycle | None = None  # made at first use: xdist names the worker after imports


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))  # all interfaces: some tests' servers listen on 0.0.0.0
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` ports of this process's band that nothing holds now, none handed out before by
    this process (until its band wraps around)."""
    global _next
    if _next is None:
        _next = itertools.cycle(band())
    ports: list[int] = []
    for _ in range(BAND):
        port = next(_next)
        if _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"fewer than {count} free ports in {band()}")


def free_port() -> int:
    return free_ports(1)[0]
