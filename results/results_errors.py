"""What the results package raises and warns; ResultsError is bad input (an InputError), which
the CLI's one handler turns into `error: MESSAGE`, exit 2."""

from nli_models.errors import InputError


class ResultsError(InputError):
    """Bad input the user can fix (unknown experiment, unknown row, missing artifact, ...)."""


class ResultsWarning(UserWarning):
    """Something in the tracked runs the table works around, e.g. a stale nli.selected tag."""
