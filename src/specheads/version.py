"""The specheads version, recorded in every checkpoint and export."""

__version__ = "0.1.0"
