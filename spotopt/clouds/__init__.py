"""Every cloud spotopt runs on, one folder each, behind one registry (``spotopt.clouds.registry``).

Shared code lives in ``common/``; ``<cloud>/`` never imports another cloud's folder. This package
imports nothing on its own: importing a cloud's module must stay cheap (no SDK, no database).
"""
