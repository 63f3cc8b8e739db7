"""4-bit post-training quantization: SVDQuant (Li et al., ICLR 2025, "SVDQuant: Absorbing Outliers by Low-Rank
Components for 4-Bit Diffusion Models": smoothing, the 16-bit low-rank branch and the 4-bit residual) and its
baselines RTN, SmoothQuant, SVD-only, W4A16 and W8A8, each a registered quantizer (:data:`QUANTIZERS`,
:func:`register_quantizer`). Method, defaults and checks: docs/methods/svdquant.md.

W4A4 runs simulated on CPU (there is no CPU kernel for 4-bit x 4-bit matmuls; docs/methods/svdquant.md, "CPU
kernels"); W4A16 and W8A8 use
PyTorch's real low-bit CPU kernels. Storage is real: 4-bit codes are packed two per byte in safetensors.
"""

from . import kernels, w4a4  # noqa: F401  (register the built-in quantizers; a new one: one more name here)
from .api import METHODS, quant_info, quantize
from .calibrate import SearchConfig, alpha_beta_grid, resolve_search, smooth_factor, svd_r
from .collect import trajectory_calibration
from .kernels import W4A16Layer, W8A8Layer, kernel_support
from .layers import SVDQLayer, bits_per_weight, build_svdq_layer
from .lora import merge_lora, merge_loras
from .mapping import Group, select_groups
from .registry import QUANTIZERS, Quantizer, QuantJob, register_quantizer
from .serialize import formula_bytes, load, save, tensor_bytes

__all__ = [
    "METHODS",
    "QUANTIZERS",
    "QuantJob",
    "Quantizer",
    "Group",
    "SVDQLayer",
    "SearchConfig",
    "W4A16Layer",
    "W8A8Layer",
    "alpha_beta_grid",
    "bits_per_weight",
    "build_svdq_layer",
    "formula_bytes",
    "kernel_support",
    "load",
    "merge_lora",
    "merge_loras",
    "quant_info",
    "quantize",
    "register_quantizer",
    "resolve_search",
    "save",
    "select_groups",
    "smooth_factor",
    "svd_r",
    "tensor_bytes",
    "trajectory_calibration",
]
