"""The example Flower app that ``flwr run .`` starts: FLMarket's market, then FedAvg on the winners.

Its ServerApp and ClientApp, the run-config schema, the data sets, models and training it uses, and the
stand-alone demo. It builds on the plugin (``flmarket_flwr.pass_protocol``, ``flmarket_flwr.pricing``,
``flmarket_flwr.market``) and needs the ``[app]`` extra (torch, scikit-learn); the plugin never imports it.
"""
