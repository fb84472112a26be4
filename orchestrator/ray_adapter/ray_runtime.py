"""Ray's start and stop in the driver, and the resources a sweep asks of it (with an autoscaler's
help): the part of the Ray adapter that is Ray itself rather than Tune (the Tuner: tuner.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import ray

from nli_models.cpus import usable_cpus
from nli_models.errors import InputError, error_line
from orchestrator.cli.options import DEFAULT_RAY_START_TIMEOUT_S, RAY_START_TIMEOUT_ENV
from orchestrator.ray_adapter.reaper import descendants, same_process, signal_pending, start_reaper
from orchestrator.sweep.environment import WAIT_POLICY

if TYPE_CHECKING:
    from orchestrator.sweep.spec import SweepSpec


# -- the driver -------------------------------------------------------------------------------
@contextlib.contextmanager
def _sigterm_blocked():
    """SIGTERM blocked while Ray starts or connects. A local Ray's processes inherit the signal
    mask: SIGTERM to the sweep's whole process group (what `timeout`, SLURM and Kubernetes send)
    then reaches the driver alone, which stops the trials, records the state and shuts Ray down
    itself, as on Ctrl-C (Ray blocks SIGINT in its processes the same way); before, Ray's
    processes died first and the driver could record nothing. The driver's own mask is restored
    at the end, and a TERM that came meanwhile is delivered then."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def joins_a_cluster(address: str | None) -> bool:
    """Whether init_ray joins a running cluster (--address or RAY_ADDRESS) rather than starting
    a private local instance."""
    return bool(address or os.environ.get("RAY_ADDRESS"))


START_PROGRESS_EVERY_S = 15.0
_HUNG_EXIT_GRACE_S = 15.0  # after the deadline, for a start stuck where Python cannot raise
_REFIRE_S = 0.05  # the deadline's alarm again, after it landed where Python could not raise it


class RayStartError(RuntimeError):
    """Ray could not be started or joined; the message names the cause and the fix."""


class _StartDeadline(BaseException):
    """Raised in the main thread when the start's deadline passes. A BaseException: Ray's start
    catches Exception in places, and must not swallow it."""


def _ray_logs() -> str:
    """A local Ray's log folder, in the temp folder Ray uses by default: RAY_TMPDIR, else TMPDIR,
    else /tmp (Ray's rule on Linux, where sweeps run; tests/test_ray_start.py checks that it
    agrees with Ray's own)."""
    temp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return f"{temp}/ray/session_latest/logs"


def _start_failure(exc: BaseException, timeout_s: float, address: str | None) -> str:
    """One line for a failed start or join: the cause and the fix."""
    if isinstance(exc, _StartDeadline) or "timed out during startup" in str(exc):
        return (f"Ray did not start within {timeout_s:g} s (--ray-start-timeout, or "
                f"{RAY_START_TIMEOUT_ENV}): the machine is too busy, or one of Ray's processes died "
                f"while starting (their logs: {_ray_logs()}); raise the timeout, or run when the "
                "machine is less loaded")
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "AF_UNIX path length" in text:
        path = text.rsplit(": ", 1)[-1]
        return (f"Ray cannot start: its socket {path} is {len(path.encode())} bytes long, more than a "
                "Unix socket path may hold (107); the temporary folder it lies in (RAY_TMPDIR, else "
                "TMPDIR) is too deep: set RAY_TMPDIR to a short folder, e.g. RAY_TMPDIR=/tmp")
    if address:
        return (f"could not join the Ray cluster at {address}: {text}; check that it runs and "
                "that --address (or RAY_ADDRESS) names its head")
    return f"Ray could not start: {text} (its logs: {_ray_logs()})"


@contextlib.contextmanager
def _start_deadline(timeout_s: float):
    """`timeout_s` for Ray's start, whatever part of it waits: the raylet's registration, which Ray
    gives a fixed 30 s, is polled until the deadline instead (a line every START_PROGRESS_EVERY_S
    says so); at the deadline _StartDeadline is raised in the main thread (SIGALRM); a start stuck
    where Python cannot raise (in Ray's C++ core) ends the process _HUNG_EXIT_GRACE_S later, its
    Ray processes with it (the reaper started before)."""
    from ray._private import services

    started = time.monotonic()
    deadline = started + timeout_s
    get_node = services.get_node

    def registered_node(*args, **kwargs):
        said = started
        while True:
            try:
                return get_node(*args, **kwargs)
            except RuntimeError:  # not registered yet
                if time.monotonic() >= deadline:
                    raise
                if time.monotonic() - said >= START_PROGRESS_EVERY_S:
                    said = time.monotonic()
                    print(f"Ray is still starting: {said - started:.0f} s of {timeout_s:g} s "
                          "(--ray-start-timeout)", file=sys.stderr, flush=True)
                time.sleep(0.5)

    passed = threading.Event()

    def expired(signum, frame):
        passed.set()
        raise _StartDeadline()

    # The alarm can land where Python cannot raise and prints the exception instead (an at-fork
    # hook: "Exception ignored in ... logging._releaseLock", seen in CI, 8 lines on stderr):
    # there it is silenced and fires again shortly, somewhere it can raise.
    unraisable_hook = sys.unraisablehook

    def swallowed(unraisable):
        if isinstance(unraisable.exc_value, _StartDeadline) and main_thread:
            signal.setitimer(signal.ITIMER_REAL, _REFIRE_S)
        else:
            unraisable_hook(unraisable)

    def give_up():
        print(error_line(_start_failure(_StartDeadline(), timeout_s, None)), file=sys.stderr, flush=True)
        os._exit(1)

    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    backstop = threading.Timer(timeout_s + _HUNG_EXIT_GRACE_S, give_up)
    backstop.daemon = True
    backstop.start()
    services.get_node = registered_node
    sys.unraisablehook = swallowed
    try:
        yield
        # Where Python swallowed the exception without a word (a bare `except` in a library),
        # the start went on past its deadline: a deadline that passed fails the start anyway.
        if passed.is_set():
            raise _StartDeadline()
    finally:
        if main_thread:  # first: no alarm during the rest
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = unraisable_hook
        services.get_node = get_node
        backstop.cancel()


def init_ray(address: str | None = None, verbose: bool = False, wait_policy: str | None = None,
             start_timeout_s: float | None = None) -> bool:
    """Join the cluster in RAY_ADDRESS / `address`, or start a local instance with the CPUs this
    process may use. `wait_policy`: the OMP_WAIT_POLICY of the job's workers (the trials), given
    in its runtime environment, so that it is set before a worker loads torch. `start_timeout_s`:
    how long the start or join may take (None: DEFAULT_RAY_START_TIMEOUT_S). RayStartError when
    it fails or takes longer, with what it started stopped. Returns whether this call connected (False: the
    process was already connected, e.g. by a test session)."""
    if ray.is_initialized():
        return False
    timeout_s = DEFAULT_RAY_START_TIMEOUT_S if start_timeout_s is None else start_timeout_s
    # ray.init puts its own SIGTERM handler on the driver, sys.exit(15): a TERM while it connects
    # or just after (seen under SLURM, whose script passes the time-limit TERM on as the sweep
    # opens) ended the process with exit 15 instead of the sweep's own handling (exit 3). The
    # sweep's handler goes back while SIGTERM is still blocked, so such a TERM reaches it.
    sigterm_handler = signal.getsignal(signal.SIGTERM)
    kwargs: dict[str, Any] = {"log_to_driver": verbose, "logging_level": "INFO" if verbose else "WARNING"}
    if wait_policy is not None:
        kwargs["runtime_env"] = {"env_vars": {WAIT_POLICY: wait_policy}}
    local = not joins_a_cluster(address)
    global _reaper
    if local:
        # Before Ray starts: its processes go with this process, even on SIGKILL or a start that
        # hangs (_start_deadline), and a failed start's are stopped by shutdown_ray.
        _reaper = start_reaper()
    running_before = set(descendants(os.getpid()))
    try:
        with _sigterm_blocked(), _start_deadline(timeout_s):
            if local:
                # address="local": always a private instance. A bare ray.init() joins the cluster
                # named in Ray's current-cluster file, which a killed `ray start --head` leaves
                # behind (a dead head then hangs every local sweep). Ray would count every CPU of
                # the machine, not the ones this process may use (taskset, cpusets): trials would
                # share them. Ray would also prestart one worker per CPU when the driver connects:
                # in a sweep they stayed idle to the end (a trial's actor starts a worker with the
                # sweep's runtime environment), and the two cost 1.0-1.2 CPU-s to start
                # (benchmarks/README.md, "sweep_cpu"; tests/test_ray_stop.py checks that none starts).
                ray.init(address="local", num_cpus=usable_cpus(), include_dashboard=False,
                         _system_config={"prestart_worker_first_driver": False}, **kwargs)
            else:
                ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
            if sigterm_handler is not None:
                signal.signal(signal.SIGTERM, sigterm_handler)
    except (Exception, _StartDeadline) as exc:
        _stop_failed_start(_started_since(running_before))
        raise RayStartError(_start_failure(exc, timeout_s, None if local else
                                           address or os.environ["RAY_ADDRESS"])) from None
    if local:
        _instance.update(_started_since(running_before))
    return True


def _started_since(running_before: set[int]) -> dict[int, int]:
    """This process's descendants (pid -> start time) that were not there before, the reaper not."""
    return {pid: start for pid, start in descendants(os.getpid()).items()
            if pid not in running_before and (_reaper is None or pid != _reaper.pid)}


def _stop_failed_start(started: dict[int, int]) -> None:
    """What a failed start left (`started`): Ray knows the processes of a start that got as far as
    its node (shutdown_ray); those of one cut short (the GCS of a node whose raylet never
    registered) are this process's children that were not there before."""
    _instance.update(started)
    with contextlib.suppress(Exception):
        shutdown_ray()


AUTOSCALING_WAIT_S = 600.0  # on an autoscaling cluster: a GPU node boots in ~5-10 minutes
PROGRESS_EVERY_S = 15.0


def autoscaling() -> bool:
    """Whether the cluster's autoscaler can start nodes: its monitor reports the node types of a
    cluster config (`ray up`, KubeRay, ray.cluster_utils.AutoscalingCluster). A plain `ray start`
    or local instance runs it read-only, with each node's type named after the node itself."""
    from ray.autoscaler._private.util import format_readonly_node_type

    types = (_autoscaler_report().get("node_type_mapping") or {}).items()
    return any(name != format_readonly_node_type(node) for node, name in types)


def _autoscaler_report() -> dict:
    """The autoscaler monitor's last report ({} before its first). The one read of Ray's private
    key-value store: Ray 2.60 has no public API for the report's node_type_mapping (the public
    `ray status` prints it as text; ray.autoscaler.v2.sdk.get_cluster_status is not public API
    and drops the mapping)."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.experimental.internal_kv import _internal_kv_get

    status = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    return (json.loads(status).get("autoscaler_report") or {}) if status else {}


def _fits(cpu: float, gpu: float) -> tuple[bool, list[dict]]:
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return any(n.get("CPU", 0) >= cpu and n.get("GPU", 0) >= gpu for n in nodes), nodes


def check_resources(cpu: float, gpu: float, wait_s: float | None = None) -> None:
    """InputError when no node of the cluster can hold one trial (`resources.cpu` and
    `resources.gpu` per trial): Tune would wait forever. Until a node fits, the autoscaler is
    asked for one trial's worth (request_resources) and the sweep waits `wait_s` seconds
    (default: AUTOSCALING_WAIT_S on an autoscaling cluster, else none), saying so every
    PROGRESS_EVERY_S; the request is withdrawn once a node fits (Tune's own demand then keeps
    the cluster up) or the wait ends."""
    fits, nodes = _fits(cpu, gpu)
    if fits:
        return
    if wait_s is None:
        wait_s = AUTOSCALING_WAIT_S if autoscaling() else 0.0
    if wait_s > 0:
        from ray.autoscaler.sdk import request_resources

        bundle = {"CPU": cpu, **({"GPU": gpu} if gpu else {})}
        request_resources(bundles=[bundle])
        started = time.monotonic()
        try:
            while not fits and time.monotonic() - started < wait_s:
                print(f"waiting for a node with {cpu:g} CPU and {gpu:g} GPU (asked the Ray "
                      f"autoscaler): {time.monotonic() - started:.0f}s of {wait_s:.0f}s",
                      file=sys.stderr, flush=True)
                time.sleep(min(PROGRESS_EVERY_S, max(wait_s - (time.monotonic() - started), 0.1)))
                fits, nodes = _fits(cpu, gpu)
        finally:
            request_resources(bundles=[])
        if fits:
            return
    largest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
    waited = (f" after waiting {wait_s:.0f}s for the autoscaler to start one (--wait-for-resources)"
              if wait_s else "")
    raise InputError(
        f"search.resources: a trial asks for {cpu:g} CPU and {gpu:g} GPU, but no node of the Ray "
        f"cluster has that much{waited} (largest node: {largest.get('CPU', 0):g} CPU, "
        f"{largest.get('GPU', 0):g} GPU); ask for at most that per trial, join a larger cluster "
        "with --address, or on a cluster that adds nodes give it time with --wait-for-resources "
        "SECONDS"
    )


_reaper = None
_instance: dict[int, int] = {}  # the processes of the local instance this process started: pid -> start
_TERM_POLL_S = 0.005  # how often the stop looks for Ray's pending TERMs


@contextlib.contextmanager
def _term_becomes_kill(running: dict[int, int]):
    """Ray stops a local instance's processes with SIGTERM, waits a second for each, then sends
    SIGKILL. Ours start with SIGTERM blocked (_sigterm_blocked), so that wait never ends early:
    it cost 5 s at the end of every sweep (and of every Ctrl-C) for the same SIGKILL. Meanwhile a
    thread watches `running` (pid -> start time) and sends SIGKILL to each process as soon as a
    TERM waits there blocked (/proc shows it pending): Ray's wait ends at once. (Killing them
    before Ray's stop costs the same 5 s: the driver then waits for its dead raylet.)"""
    done = threading.Event()

    def watch():
        while not done.is_set():
            for pid, start in running.items():
                if signal_pending(pid, signal.SIGTERM) and same_process(pid, start):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            done.wait(_TERM_POLL_S)

    watcher = threading.Thread(target=watch, name="ray-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def shutdown_ray() -> None:
    """Disconnect from Ray; a local instance this process started is stopped, every process of it
    (the raylet's agents and workers, which a raylet killed at once leaves behind, included)."""
    global _reaper
    running: dict[int, int] = {}
    for pid, start in _instance.items():
        if same_process(pid, start):
            running.update({pid: start, **descendants(pid)})
    _instance.clear()
    with _term_becomes_kill(running):
        ray.shutdown()
    for pid, start in running.items():
        if same_process(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if _reaper is not None:
        _reaper.terminate()
        _reaper.wait()
        _reaper = None


def trial_slots(spec: SweepSpec) -> int:
    """The Tune trials the running Ray cluster holds at once for the sweep (SweepSpec.trial_slots
    of its CPUs and GPUs), which size search.stack auto's stacks.

    Args:
        spec: the sweep.
    """
    resources = ray.cluster_resources()
    return spec.trial_slots(resources.get("CPU", 0.0), resources.get("GPU", 0.0))
