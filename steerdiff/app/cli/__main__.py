"""``python -m steerdiff.app.cli``: the ``steerdiff`` command line without the console script."""

from . import main

main()
