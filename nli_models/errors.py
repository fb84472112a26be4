"""The one exception type for bad input (a spec, a config, a data or vector file, an option).

Its message names the file, the field path or line, what is wrong and what is allowed. The CLI
turns it into `error: MESSAGE` and exit code 2, with no traceback; code that checks input before
anything is written raises it (or a subclass), never a bare ValueError.
"""


class InputError(ValueError):
    """Bad input from the user; the message is complete and shown as is."""
