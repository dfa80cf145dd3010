"""FLMarket for Flower: pre-training pricing and client selection."""
