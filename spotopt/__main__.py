"""``python -m spotopt`` is the ``spotopt`` command."""

from spotopt.cli.app import main

main()
