"""spotopt: make GPU training cheaper on the public clouds without missing deadlines.

Importing this package must stay cheap: no cloud SDK, no solver, no database driver is
imported here (tests check ``sys.modules``).
"""

__version__ = "0.1.0"
"""The version of this source tree; ``pyproject.toml`` carries the same (a test keeps them equal)."""

DISTRIBUTION = "spotopt-gpu"
"""The distribution's name on an index (``pip install "spotopt-gpu[aws]"``). The import package
and the command are ``spotopt``, but ``spotopt`` on PyPI is another project, so no install hint
or start-up script ever names it."""


def pip_install_hint(extra: str) -> str:
    """The command that adds ``extra`` to this installation (pip keeps the installed distribution
    and installs only the extra's requirements)."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'
