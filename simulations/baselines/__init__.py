"""The experiments' baselines, apart from the plugin: never imported by ``flmarket_flwr``.

* :mod:`simulations.baselines.selectors` -- the pre-training client selectors the paper compares
  (RS, QBS, DICE, DDS) beside FLMarket's own score-and-auction selection, on label counts.
* :class:`SFedAvg` -- S-FedAvg (Nagalapatti & Narayanam, AAAI 2021), the paper's in-training
  baseline: Shapley-value-weighted client sampling every round; :class:`RelevanceSampler` is its
  Flower-free relevance state (sampling, valuation, update), which the sweeps' engine uses too.
"""

from simulations.baselines.sfedavg import (
    RelevanceSampler,
    SFedAvg,
    SFedAvgRound,
    ShapleyEstimate,
    estimate_shapley,
    sample_without_replacement,
    softmax,
)

__all__ = [
    "RelevanceSampler",
    "SFedAvg",
    "SFedAvgRound",
    "ShapleyEstimate",
    "estimate_shapley",
    "sample_without_replacement",
    "softmax",
]
