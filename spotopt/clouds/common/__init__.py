"""What every cloud shares: the provider contract, its call wrapper, the start-up script and what
it ships (artifacts, the downloader ``fetch``), resource naming, the HTTP helper, the lazy SDK
imports and the ``clouds`` router."""
