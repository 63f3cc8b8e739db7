"""NAMM maps and OCM covariance heads in a bf16 / fp16 model (issue 36): outputs in the model's dtype, close to the
float32 maps on the same (rounded) inputs.

Tolerance: each layer rounds at the unit roundoff u (2^-8 in bf16, 2^-11 in fp16) and a few layers add a few u of
relative error; we allow 5 u (0.02 in bf16, 2.5e-3 in fp16), and require the error to be non-zero for bf16 so
that the half-precision path was really taken."""

import copy

import pytest
import torch

from steerdiff.constrain import NAMM, ICNNMap, ResidualMLP
from steerdiff.models.icnn import ConvICNNMap
from steerdiff.models.ocm_heads import InputHead

TOL = {torch.bfloat16: 0.02, torch.float16: 2.5e-3}


def _spread(module: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial weights everywhere (zero-initialised output layers would make a map the identity)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return module


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(6,), (1, 4, 4)])
def test_namm_maps_run_in_the_models_dtype(shape, dtype):
    torch.manual_seed(0)
    fwd = ICNNMap(dim=6, hidden=16, layers=2) if len(shape) == 1 else ConvICNNMap(shape=shape, filters=4, layers=2)
    namm = NAMM(_spread(fwd), _spread(ResidualMLP(shape=shape, hidden=16)), lambda x: x.flatten(1).norm(dim=1))
    half = copy.deepcopy(namm).to(dtype)
    x = torch.randn(64, *shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        for name in ("encode", "decode"):
            out, ref = getattr(half, name)(x), getattr(namm, name)(x.float())
            assert out.dtype == dtype, name
            err = _rel(out, ref)
            assert err <= TOL[dtype], (name, err)
            assert err > 0 or dtype != torch.bfloat16, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ocm_head_covariance_in_the_models_dtype(dtype):
    """A half-precision head returns ``c`` in its input's dtype: half on a half state, float32 on a float32 state
    (the head casts to its weights' dtype and back)."""
    head = _spread(InputHead(dim=6, hidden=16, depth=2))
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(2))
    sigma = torch.rand(64, generator=torch.Generator().manual_seed(3)) * 3 + 0.1
    half = copy.deepcopy(head).to(dtype)
    with torch.no_grad():
        ref = head.covariance(x.to(dtype).float(), sigma.to(dtype).float())
        c = half.covariance(x.to(dtype), sigma.to(dtype))
        assert c.dtype == dtype and half.covariance(x, sigma).dtype == torch.float32
    assert _rel(c, ref) <= TOL[dtype], _rel(c, ref)
