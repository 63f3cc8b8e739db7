"""Device and dtype follow the model in the inverse solvers (issue 36): no host read per level in DPS, a DPS run on
``meta`` (which fails at any host read and at any CPU/meta mix), and the solver loops in bf16 / fp16."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from steerdiff.core.noise import SampleNoise, make_generators
from steerdiff.core.sigmas import vp_linear_levels
from steerdiff.inverse import Matrix, solve
from steerdiff.inverse.dps import dps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from host_sync import count_host_reads  # noqa: E402

VAR = 0.5


class GaussianDenoiser(nn.Module):
    """The exact denoiser of ``N(0, VAR I)`` in 2-D, in its parameter's dtype and device, asserting its input's."""

    sample_shape = (2,)

    def __init__(self, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.var = nn.Parameter(torch.tensor(VAR, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x, sigma, cond=None):
        assert x.dtype == self.var.dtype and x.device == self.var.device, (x.dtype, x.device)
        s = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).reshape(-1, 1)
        return x * (self.var / (self.var + s * s))


A = torch.tensor([[1.0, 0.5]])


def test_dps_host_reads_do_not_grow_with_the_levels():
    """A whole ``solve(..., "dps")`` at 8 and at 16 levels makes the same number of host reads (each a device sync on
    a GPU): the non-finite guard stays on the device and is read once, after the loop."""
    y = torch.tensor([[0.3], [0.1]])

    def run(n):
        return solve(GaussianDenoiser(), A, y, "dps", noise_std=0.2, steps=n, chains=3, generator=0, scale=0.5)

    run(8)  # warm core's cached schedule table (its checks read the host once, on first use)
    counts = [count_host_reads(run, n)[1] for n in (8, 16)]
    assert counts[0] == counts[1], counts


class _Stop(Exception):
    pass


def test_a_meta_dps_run_keeps_the_chains_on_the_models_device():
    """Model, measurements and state on ``meta``, CPU generators (drawn on the CPU and moved): any host read or
    CPU/meta mix in the loop raises. Stopped at the last level, before the one read that reports dead chains."""
    levels = vp_linear_levels(4).tolist()
    op = Matrix(A).bind((2,))
    y = torch.zeros(3, 1, device="meta")
    seen = []

    def callback(info):
        assert info["x"].device.type == "meta" and info["denoised"].device.type == "meta"
        seen.append(info["i"])
        if info["i"] == len(levels) - 1:
            raise _Stop

    with pytest.raises(_Stop):
        dps(GaussianDenoiser(torch.float32, "meta"), op, y, levels, scale=0.5,
            noise=SampleNoise(make_generators(0, 3, "cpu")), callback=callback)
    assert seen == list(range(len(levels)))


@pytest.mark.parametrize("dtype,method", [(torch.bfloat16, m) for m in ("dps", "dr", "cr", "hr")]
                         + [(torch.float16, m) for m in ("dps", "dr")])
def test_solve_with_a_half_precision_model_matches_float32(method, dtype):
    """A bf16 / fp16 model under ``solve``: the model gets the state in its dtype (the denoiser asserts it), the
    state, Adam and the DPS step stay in float32, and the posterior the chains sample is the float32 run's.

    Tolerance: both runs share every draw and differ only by the model's rounding (2^-8 relative in bf16, 2^-11 in
    fp16, on an O(1) state); over 256 chains the chain mean may move 0.03 and the chains' spread 5%, both well
    inside the Monte Carlo error of the estimates (``std / sqrt(256)`` is 0.02-0.03 here) and far from the
    changes a wrong dtype or device would make."""
    y = torch.full((1, 1), 0.4)
    opts = {"scale": 0.5} if method == "dps" else {}
    out = {}
    for dt in (torch.float32, dtype):
        res = solve(GaussianDenoiser(dt), A, y, method, noise_std=0.2, steps=20, chains=256, generator=0, **opts)
        assert res.samples.dtype == torch.float32 and res.n_nonfinite == 0
        out[dt] = res.samples[0]
    ref, got = out[torch.float32], out[dtype]
    assert float((got.mean(0) - ref.mean(0)).abs().max()) <= 0.03, (got.mean(0), ref.mean(0))
    assert float((got.std(0) / ref.std(0) - 1).abs().max()) <= 0.05, (got.std(0), ref.std(0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_dps_loop_runs_in_the_models_dtype(dtype):
    """:func:`~steerdiff.inverse.dps.dps` itself (below ``solve``) with measurements and model in half precision:
    the chains stay in that dtype and end where the float32 chains from the same draws end, up to rounding (median
    chain 0.02 away at most: a few bf16 ulps at unit scale; a chain here and there drifts further where DPS's large
    early steps amplify a rounding, so the tail is not bounded; the chain mean within 0.03, as above)."""
    levels = vp_linear_levels(20).tolist()
    op = Matrix(A).bind((2,))
    out = {}
    for dt in (torch.float32, dtype):
        x, dead = dps(GaussianDenoiser(dt), op, torch.full((256, 1), 0.4, dtype=dt), levels, scale=0.5,
                      noise=SampleNoise(make_generators(0, 256, "cpu")))
        assert x.dtype == dt and (dead < 0).all()
        out[dt] = x.float()
    diff = out[dtype] - out[torch.float32]
    assert float(diff.abs().median()) <= 0.02, float(diff.abs().median())
    assert float(diff.mean(0).abs().max()) <= 0.03, diff.mean(0)
