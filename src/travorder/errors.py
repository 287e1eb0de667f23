"""Errors that travorder reports to its users.

Every error a user can cause (a bad file, a bad name, a bad option) is a
:class:`TravorderError`; the command line prints its message on one line and exits
with code 2. Anything else is a bug and keeps its traceback.
"""


class TravorderError(ValueError):
    """A problem with the user's input, reported as one line."""


class GraphError(TravorderError):
    """An operation graph that is not valid (duplicate names, cycles, bad costs...)."""


class FormatError(TravorderError):
    """A file that cannot be read: missing, empty, truncated, or of an unknown format."""
