"""Whether the Ray cluster a sweep is told to join answers: checked before anything is written,
by `sweep` and `validate` alike (orchestrator.sweep.plan.check_input), without importing Ray."""

from __future__ import annotations

import os
import socket

from nli_models.errors import InputError

ADDRESS_TIMEOUT_S = 5.0


def check_ray_address(address: str | None) -> None:
    """InputError within seconds when the cluster address (--address or RAY_ADDRESS) has nothing
    listening: ray.init would otherwise retry for minutes. A local sweep (no address) passes."""
    given = address or os.environ.get("RAY_ADDRESS")
    if not given or given in ("auto", "local"):
        return
    option = "--address" if address else "RAY_ADDRESS"
    target = given.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"{option} {given!r}: expected HOST:PORT (e.g. 10.0.0.5:6379) or ray://HOST:PORT"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_TIMEOUT_S).close()
    except OSError as exc:
        raise InputError(
            f"{option} {given!r}: no Ray cluster answers at {host}:{port} "
            f"({getattr(exc, 'strerror', None) or exc}); start it with `ray start --head` on that "
            "machine, or leave out --address (and RAY_ADDRESS) for a private local Ray"
        ) from None
