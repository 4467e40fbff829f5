"""spade-async: SPADE self-play RL on one node."""

__version__ = "0.1.0"
