"""What the buyer and the node both read: the market's messages and their typed records, the award, Flower records
at the market's volume, the config-value check, the security profiles and the release ledgers' differencing rule.

The buyer (:mod:`flmarket_flwr.market.buyer`) and the node (:mod:`flmarket_flwr.market.node`) meet here and never
import each other.
"""
