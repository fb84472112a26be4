"""The one exception type for bad input (a spec, a config, a data or vector file, an option).

Its message names the file, the field path or line, what is wrong and what is allowed. The CLI
turns it into `error: MESSAGE` and exit code 2, with no traceback; code that checks input before
anything is written raises it (or a subclass), never a bare ValueError.
"""

import re


class InputError(ValueError):
    """Bad input from the user; the message is complete and shown as is."""


class InputFileMissing(InputError, FileNotFoundError):
    """A file named by the input (a corpus split, a vector file) does not exist."""


_URI_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@")


def mask_secrets(text: str) -> str:
    """`text` with the password of every URI in it (`scheme://user:PASSWORD@host`) replaced by
    `***`: error messages, `validate` output and tags show where a store is, never its secret."""
    return _URI_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def without_passwords(text: str) -> str:
    """`text` with the password of every URI in it removed (`scheme://user@host`): a record kept
    on disk names the store, and the reader brings its own credentials (MLflow's environment
    variables, ~/.pgpass, PGPASSWORD)."""
    return _URI_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}@", text)


def error_line(message: str) -> str:
    """`error: MESSAGE` as the CLI prints bad input: one line (a parser's multi-line message
    joined), passwords masked."""
    return "error: " + " ".join(mask_secrets(message).split())
