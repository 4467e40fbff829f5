"""The ``spade`` commands: ``main`` dispatches; one module per top-level command."""

from spade_async.cli.dispatch import main

__all__ = ["main"]
