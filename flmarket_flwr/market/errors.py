"""The market phase's error, shared by the server steps and the PASS rounds."""

__all__ = ["MarketError"]


class MarketError(RuntimeError):
    """The market phase cannot complete (too few clients, PASS unrecoverable, bounds failed, no bids)."""
