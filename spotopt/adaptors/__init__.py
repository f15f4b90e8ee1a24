"""Lazy imports of the cloud SDKs and client factories (the single seam tests replace)."""
