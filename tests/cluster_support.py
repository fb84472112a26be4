"""Old import names of the helpers now in the testkit package, for test modules written before it
(delete once none imports this). `write_spec` here is testkit.specs.write_quickstart."""

from testkit import BIN, REPO  # noqa: F401
from testkit.cli import Result, orchestrate  # noqa: F401
from testkit.postgres import PG_HOST, PG_PORT, PG_USER, new_database  # noqa: F401
from testkit.processes import Group, base_env, http_ok, http_status, wait_for  # noqa: F401
from testkit.ray_nodes import RayHead, RayWorker, node_ports, stop_ray_nodes  # noqa: F401
from testkit.specs import write_quickstart as write_spec  # noqa: F401
from testkit.tracking_server import TrackingServer  # noqa: F401
