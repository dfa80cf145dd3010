"""The client side of the market as a Flower mod, for a ``ClientApp`` built with a ``client_fn``.

Usage, beside Flower's own mods::

    app = ClientApp(client_fn=client_fn, mods=[market_mod(my_label_counts), secaggplus_mod])

The mod answers the market's ``query`` messages with the handlers :func:`.client.register_market_handlers` registers
on a Message-API app (one set, :func:`.client.market_handlers`) and passes every other message on, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message, MessageType
from flwr.clientapp.typing import ClientAppCallable, Mod

from flmarket_flwr.market.node.bidding import BidPolicy
from flmarket_flwr.market.node.client import LabelCountsFn, SettingsFn, market_handlers

__all__ = ["market_mod"]


def market_mod(
    label_counts: LabelCountsFn,
    bid_policy: BidPolicy | None = None,
    *,
    settings: SettingsFn | None = None,
) -> Mod:
    """The market's client side as a mod: ``ClientApp(client_fn=client_fn, mods=[market_mod(label_counts)])``.

    A ``ClientApp`` built with a ``client_fn`` (a ``NumPyClient``'s, with ``secaggplus_mod`` or ``fixedclipping_mod``
    say) takes no ``@app.query`` handlers; a mod sees every message before the app does. This one answers the
    market's messages (``query.market_advertise``, ...) itself, exactly as :func:`.client.register_market_handlers`
    does in a Message-API app, with the same rules, and hands every other message (train, evaluate, SecAgg+'s
    stages, the app's own queries) to the next mod or the app, untouched: put it anywhere in ``mods``.

    In a Message-API app (``@app.train()``, ...) use :func:`.client.register_market_handlers` instead: Flower runs an
    app's mods only around the functions registered on it, so the market's messages would never reach the mod.

    Parameters
    ----------
    label_counts : Callable[[Context], numpy.ndarray]
        Returns the client's per-class label counts ``N_e`` (see :func:`.client.register_market_handlers`); with
        :func:`~flmarket_flwr.market.node.labels.label_counts` over the app's own data loading, e.g.
        ``lambda c: label_counts(load_data(c.node_config["partition-id"], ...)[0], num_classes=10)``.
    bid_policy : BidPolicy, optional
        The client's bid policy; defaults to ``CostBasedBid(DEFAULT_COST_PER_SAMPLE)``.
    settings : Callable[[Context], NodeSettings], optional
        The node's settings at one message, in place of its node config's (as for ``register_market_handlers``).

    Returns
    -------
    Mod
        A Flower mod, ``(message, context, call_next) -> reply``.
    """
    return _MarketMod(market_handlers(label_counts, bid_policy, settings=settings))


class _MarketMod:
    """The mod: the market's handlers by message type; a module-level class, so that Ray can pickle the app."""

    def __init__(self, handlers: dict[str, Callable[[Message, Context], Message]]) -> None:
        self.handlers = {f"{MessageType.QUERY}.{action}": handler for action, handler in handlers.items()}

    def __call__(self, message: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Answer a market message; pass any other on."""
        handler = self.handlers.get(message.metadata.message_type)
        if handler is None:
            return call_next(message, context)
        return handler(message, context)

    def __repr__(self) -> str:
        """Name the mod (Flower logs an app's mods)."""
        return "market_mod"
