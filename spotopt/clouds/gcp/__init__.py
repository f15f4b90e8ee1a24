"""GCP: its SDK adaptor, provider, billing rule and notice poller, named by its entry in
``spotopt.clouds.registry``; nothing is imported here (the SDK only when a client is built)."""
