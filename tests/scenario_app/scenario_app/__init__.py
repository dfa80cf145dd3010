"""The FLMarket app with a ClientApp that holds one train round until the test opens it (a test fixture)."""
