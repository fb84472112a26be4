"""Old import names of testkit.toy, for test modules written before it (delete once none imports
this)."""

from testkit.toy import TOY, decomposable, tiny_config, toy_data, toy_run_config  # noqa: F401
