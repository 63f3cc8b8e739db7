"""The application wing: what steerdiff's library is *used by*, never what it is built from.

* :mod:`.cli`: the ``steerdiff`` command line (one click group, a module per subcommand);
* :mod:`.demo`: the HTML report of every landed method beside its baselines (``steerdiff demo``);
* :mod:`.protocols`: the evaluation protocols users may call (exact validation problems, testbeds, scoring);
* :mod:`.recipes`: how the shipped assets are made (training recipes and the data sets they register).

This is the only place that names a shipped asset, a protocol or a method by hand. Nothing outside ``steerdiff.app``
imports it (``scripts/import_graph.py`` and ``tests/test_layers.py`` check this); the library's choices reach the app
through the registries.
"""

from . import recipes  # noqa: F401  (registers the recipe data sets, for ``steerdiff train`` and the protocols)
