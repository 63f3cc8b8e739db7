"""Embedded data sets, generated or bundled, never downloaded (docs/methods/conventions.md, "Embedded data and
models").

* ``toy2d``: 2-D toy sets (two moons, rings, checkerboard) for the Gaussian-mixture-scale experiments.
* ``digits``: scikit-learn's 8x8 digits with a fixed stratified train/test split.
* ``shapes``: procedural coloured shapes (docs/methods/coind.md, "The coloured-shapes data").
* ``advection``: stochastic advection-diffusion sequences for forecasting (docs/methods/dydiff.md).
* ``motion`` / ``motion_synth``: articulated skeletons, procedural motion capture, BVH I/O and motion features
  (docs/methods/motiondreamer.md "Motion data").
"""

from . import advection, digits, motion, motion_synth, shapes, toy2d
from .digits import load_digits
from .shapes import COLOURS, SHAPES, split_combos
from .shapes import generate as generate_shapes
from .shapes import render as render_shape
from .toy2d import TOY2D, checkerboard, load_toy, rings, two_moons

__all__ = [
    "advection",
    "COLOURS",
    "SHAPES",
    "TOY2D",
    "checkerboard",
    "digits",
    "generate_shapes",
    "load_digits",
    "load_toy",
    "motion",
    "motion_synth",
    "render_shape",
    "rings",
    "shapes",
    "split_combos",
    "toy2d",
    "two_moons",
]
