"""orchestrator.ports: the ports a test or a SLURM job gives a Ray node's servers."""

from __future__ import annotations

import socket

from orchestrator.ports import free_port, free_ports


def test_ports_drawn_together_are_distinct_and_bindable():
    """CI once gave one port to two of a Ray head's servers (ports drawn one socket at a time),
    and `ray start` refused to run."""
    ports = free_ports(64, host="127.0.0.1")
    assert len(set(ports)) == 64
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))  # nothing holds it once chosen


def test_ports_avoid_those_already_given_out():
    given = free_port(host="127.0.0.1")  # released: the kernel may offer it again
    for _ in range(20):
        assert given not in free_ports(32, host="127.0.0.1", avoid=frozenset({given}))
