"""The node's side of the market: the ``query`` handlers a ``ClientApp`` registers in one line, the node's settings
read from its node config, its bid policies and its label counts.

It answers the buyer only through :mod:`flmarket_flwr.market.wire`, never importing :mod:`flmarket_flwr.market.buyer`.
"""
