"""Old import names of testkit.browser, for test modules written before it (delete once none
imports this)."""

from testkit.browser import Browser, WebDriverError, chromium, dump_dom, screenshot  # noqa: F401
