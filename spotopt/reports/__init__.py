"""SQL reports on the price history, registered by name."""
