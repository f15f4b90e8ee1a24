"""spotopt: make GPU training cheaper on the public clouds without missing deadlines.

Importing this package must stay cheap: no cloud SDK, no solver, no database driver is
imported here (tests check ``sys.modules``).
"""

__version__ = "0.1.0"
