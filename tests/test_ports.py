"""orchestrator.cluster.ports: the ports a SLURM job gives a Ray node's servers; testkit.ports: the ports the
suite's own servers take."""

from __future__ import annotations

import socket

from orchestrator.cluster.ports import free_port, free_ports


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


# testkit.ports: the suite's own servers' ports, one band per test process


def test_test_processes_that_run_at_once_draw_from_disjoint_bands_outside_the_kernels_and_rays_ranges():
    """The suite's xdist workers and its SLURM part run at once: no port can be handed to two of
    them. bind(0) and outgoing connections take ports from the kernel's ephemeral range, Ray's
    workers from 10002-19999 (`ray start`'s default worker ports): no band may reach into either."""
    from testkit.ports import band

    bands = [band(""), *(band(f"gw{i}") for i in range(10))]
    taken = [port for b in bands for port in b]
    assert len(taken) == len(set(taken)) == 11 * len(bands[0])
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        ephemeral_start = int(handle.read().split()[0])
    assert 19999 < min(taken) and max(taken) < ephemeral_start


def test_a_test_process_never_gets_a_port_twice_nor_one_something_holds():
    from testkit import ports

    first = ports.free_ports(3)
    band = ports.band()
    held = band[(band.index(first[-1]) + 1) % len(band)]  # the next one the band would give
    with socket.socket() as holder:  # what another server of this machine would hold
        holder.bind(("127.0.0.1", held))
        holder.listen()
        later = [port for _ in range(20) for port in ports.free_ports(2)]
        assert held not in later
    drawn = first + later
    assert len(drawn) == len(set(drawn)) == 43 and all(p in band for p in drawn)
    with socket.socket() as sock:
        sock.bind(("", drawn[-1]))  # nothing holds it once chosen
