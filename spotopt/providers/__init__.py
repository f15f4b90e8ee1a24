"""Providers: where a job runs (local processes now; AWS, GCP, Azure next)."""
