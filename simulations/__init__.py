"""Experiments: Hydra sweeps of the FLMarket Flower app (``python -m simulations.run``)."""
