"""Errors a user sees as one line (the CLI prints them and exits 2, no traceback)."""


class SpadeError(Exception):
    """Base class: the message is the whole story, shown as one line."""


class ConfigError(SpadeError):
    """A bad recipe, key, value or override."""


class UsageError(SpadeError):
    """Bad command-line input: a missing file, a bad flag value."""
