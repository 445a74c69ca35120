"""specheads: train speculative-decoding draft heads on a frozen Hugging Face target, and prove them."""

from specheads.version import __version__

__all__ = ["__version__"]
