"""The buyer's side of the market: :class:`FLMarket` and the market phase (PASS rounds, bids, the audited auction,
the awards) over a Flower ``Grid``, its settings and outcome, membership, re-launches, delivery and the winners' grid.

It speaks to the nodes only through :mod:`flmarket_flwr.market.wire`, never importing :mod:`flmarket_flwr.market.node`.
"""
