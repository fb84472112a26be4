"""Old import names of the helpers now in the testkit package, for test modules written before it
(delete once none imports this)."""

from testkit import REPO as REPO_ROOT  # noqa: F401
from testkit.cli import ORCHESTRATE, run_orchestrate, start_orchestrate  # noqa: F401
from testkit.processes import assert_processes_gone, kill_session, wait_while_driving  # noqa: F401
from testkit.specs import BASE_SPEC, merge, write_spec  # noqa: F401
from testkit.store import (  # noqa: F401
    client_for,
    runs_of,
    runs_so_far,
    store_ready,
    trial_running,
    trials_finished,
)
