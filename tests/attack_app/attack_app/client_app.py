"""The product's ClientApp, unchanged: the nodes under attack are honest."""

from flmarket_flwr.app.client_app import app

__all__ = ["app"]
