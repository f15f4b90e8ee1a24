"""AWS: its SDK adaptor, provider, billing rule, notice poller and collectors, named by its entry in
``spotopt.clouds.registry``, and its settings section (a base of ``spotopt.settings.Settings``);
nothing is imported here (the SDK only when a client is built)."""
