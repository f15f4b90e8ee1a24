"""``spotopt ui``: a read-only web dashboard over the history (fleet, job, markets, availability,
what-if). Needs the ``ui`` extra (Starlette, uvicorn, Jinja2); htmx and uPlot ship in ``static/``."""
