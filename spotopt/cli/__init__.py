"""The typer CLI: one sub-app per noun, each a thin layer over the library."""
