"""What the results package raises and warns; the CLI turns ResultsError into a usage error."""


class ResultsError(Exception):
    """Bad input the user can fix (unknown experiment, unknown row, missing artifact, ...)."""


class ResultsWarning(UserWarning):
    """Something in the tracked runs the table works around, e.g. a stale nli.selected tag."""
