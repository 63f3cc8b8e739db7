"""How the shipped assets are made: re-runnable training recipes and the data sets they register.

Importing this package registers the recipe data sets (``digits_styles``, ``digits_styles_refs``,
``digits_duplicated``, ...) with :func:`steerdiff.train.recipes.register_dataset`, so that
``steerdiff train configs/<recipe>.json`` finds them; method packages know nothing of them.

* :mod:`.ocm_digits`: the OCM head of the shipped digits UNet and its accuracy against Monte Carlo;
* :mod:`.rbmod`: the RB-Modulation digits generators (three styles, the style-token DiT);
* :mod:`.geometry`: the two small digits generators of the local-geometry claims;
* :mod:`.dydiff`: DyDiff forecasters at another seed or mixing ratio;
* :mod:`.namm`: the NAMM recipes (maps, mirror-space model, plain model, bundle);
* :mod:`.clip_tokenizer`: CLIP BPE tokenizer files written from a word list (the shipped shapes pipeline).
"""

from . import geometry, rbmod  # noqa: F401  (register their data sets)
