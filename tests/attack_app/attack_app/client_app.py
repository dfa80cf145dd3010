"""The product's ClientApp, unchanged: the nodes under attack are honest."""

from flmarket_flwr.client_app import app

__all__ = ["app"]
