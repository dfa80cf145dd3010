"""The FLMarket app with a ClientApp that hangs in ``market_mask`` on request (a test fixture)."""
