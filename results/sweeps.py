"""Sweeps as the tracking store records them, seen from outside their driver.

A parent run's tag nli.sweep_state holds the state its driver last recorded (orchestrator/
lifecycle.py moves it). A driver that died without recording anything (SIGKILL, a lost machine)
leaves `running` behind; its lease tells: nli.driver names the host and process id, and the live
driver renews nli.heartbeat every HEARTBEAT_INTERVAL_S seconds. A `running` sweep whose driver
process is gone (same host) or whose heartbeat is older than STALE_AFTER_S is `interrupted`.

Part of the contract (run_schema.py): it imports nothing heavy, so the driver (orchestrator/
lifecycle.py) takes HEARTBEAT_INTERVAL_S from here without loading MLflow. Reading sweeps from a
store is results/stored_sweeps.py.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from results import run_schema as rs

HEARTBEAT_INTERVAL_S = 10.0
STALE_AFTER_S = 60.0  # six missed heartbeats: a driver on another host is taken for dead


def recorded_state(tags: Mapping[str, str]) -> str:
    state = tags.get(rs.TAG_SWEEP_STATE, rs.SWEEP_RUNNING)
    return rs.LEGACY_SWEEP_STATES.get(state, state)


def driver_alive(tags: Mapping[str, str], now: float | None = None) -> bool:
    """Whether the driver holding the sweep's lease is alive (see the module docstring)."""
    beat = tags.get(rs.TAG_HEARTBEAT)
    host, _, pid = tags.get(rs.TAG_DRIVER, "").partition(" ")
    if beat is None or not pid.isdigit():
        return False
    if host == socket.gethostname():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, owned by another user
    return (time.time() if now is None else now) - float(beat) < STALE_AFTER_S


def observed_state(tags: Mapping[str, str], now: float | None = None) -> str:
    """The state a reader should show: `running` only while its driver is alive."""
    state = recorded_state(tags)
    if state in (rs.SWEEP_PLANNED, rs.SWEEP_RUNNING) and not driver_alive(tags, now):
        return rs.SWEEP_INTERRUPTED
    return state
