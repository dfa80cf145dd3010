"""The product's ServerApp, unchanged."""

from flmarket_flwr.app.server_app import app

__all__ = ["app"]
