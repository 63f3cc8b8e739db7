"""Style control by stochastic optimal control: RB-Modulation (Rout et al., ICLR 2025; docs/methods/rb_modulation.md,
whose headings are quoted below).

* :class:`RBModulation`: the SOC controller as an ``x0_corrector`` of :func:`steerdiff.sample` ("The controller"),
  with the content/subject mode (``content_descriptor=``, ``lam_content=``, ``content_mask=``);
* :func:`style_guidance`: the plain gradient-guidance baseline on the same cost ("Usage");
* :mod:`.afa`: attention feature aggregation for transformer denoisers with condition tokens ("Attention feature
  aggregation");
* :mod:`.styles`, :mod:`.descriptors`: the three-stroke-style digits and the style descriptors; the digits protocol
  ("The digits protocol") is :mod:`steerdiff.app.protocols.rbmod`; :mod:`steerdiff.models.style_dit`: the
  style-token DiT of the functional AFA test.
"""

from . import descriptors  # noqa: F401  (registers StyleCNN; StyleTokenDiT is steerdiff.models.style_dit)
from .afa import AFADiT, afa_block
from .rbm import COSTS, REENTRIES, RBModulation, StepRecord, cosine_cost, squared_cost, style_guidance, style_reward

__all__ = ["COSTS", "REENTRIES", "AFADiT", "RBModulation", "StepRecord", "afa_block", "cosine_cost", "squared_cost",
           "style_guidance", "style_reward"]
