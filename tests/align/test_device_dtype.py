"""Device and dtype follow the model in the align samplers (issue 36): no host read per step on the device path,
particles / rewards / indices / noise on the model's device (a ``meta`` run, which fails at any host read and at
any CPU/meta mix), and bf16 / fp16 runs in the model's dtype that agree with float32 runs."""

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import steerdiff as sd
from steerdiff.align import best_of_n, das, fk_steering, sir, smc
from steerdiff.align.rewards import Linear
from steerdiff.app.protocols.das import gaussian_chain_moments
from steerdiff.core.sigmas import karras

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from host_sync import count_host_reads  # noqa: E402

VAR, D = 0.5, 4


class GaussianDenoiser(nn.Module):
    """The exact denoiser of ``N(0, VAR I)``, ``D = x VAR / (VAR + s^2)``, computed in its parameter's dtype on its
    parameter's device; it asserts that the state it is given is in that dtype and on that device (so a sampler
    that drew or moved anything to another device or dtype fails here)."""

    def __init__(self, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.var = nn.Parameter(torch.tensor(VAR, dtype=dtype, device=device), requires_grad=False)
        self.sample_shape = (D,)

    def forward(self, x, sigma, cond=None):
        assert x.dtype == self.var.dtype and x.device == self.var.device, (x.dtype, x.device)
        s = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).reshape(-1, 1)
        return x * (self.var / (self.var + s * s))


class DeviceReward:
    """``r(x) = 1 . x``, asserting the device of what it is given."""

    def __init__(self, device):
        self.device = torch.device(device)

    def __call__(self, x):
        assert x.device == self.device, x.device
        return x.flatten(1).sum(1)


@pytest.fixture
def device_path(monkeypatch):
    """Force the device path of :func:`steerdiff.align.smc.host_decisions` on CPU tensors."""
    monkeypatch.setattr(smc, "HOST_DECISIONS", False)


def _runs(den, sig, noise, **kw):
    gens = dict(particles=8, generator=3, batch_size=None)
    return {
        "das": lambda: das(den, Linear(torch.ones(D)), noise, sig, alpha=1.0, **gens, **kw),
        "das_grad": lambda: das(den, Linear(torch.ones(D)), noise, sig, alpha=1.0, gradient=True, tempering="exp",
                                **gens, **kw),
        "fk": lambda: fk_steering(den, Linear(torch.ones(D)), noise, sig, alpha=1.0, **gens, **kw),
    }


@pytest.mark.parametrize("method", ["das", "das_grad", "fk"])
def test_device_path_equals_host_path_when_every_group_resamples(method, monkeypatch):
    """With ``ess_threshold = 1`` every group resamples at every weighting, so both paths draw the same uniforms:
    the device path (``torch.where`` instead of host decisions) must then give the host path's result bit for bit."""
    den, sig = GaussianDenoiser(torch.float64), karras(8, 0.02, 20.0)
    noise = sd.randn((4 * 8, D), seeds=0, dtype=torch.float64)
    out = {}
    for host in (True, False):
        monkeypatch.setattr(smc, "HOST_DECISIONS", host)
        out[host] = _runs(den, sig, noise, ess_threshold=1.0, output="weighted")[method]()
    for name in ("samples", "log_weights", "log_evidence", "ess", "resampled"):
        assert torch.equal(getattr(out[True], name), getattr(out[False], name)), name


@pytest.mark.parametrize("method", ["das", "das_grad", "fk"])
def test_device_path_host_reads_do_not_grow_with_the_steps(method, device_path):
    """Host reads of a whole run (counted as ``aten::_local_scalar_dense`` / ``equal`` calls, each a device sync on
    a GPU) are the same at 6 and at 14 steps: none is taken per step; the few left are the argument checks before
    the loop and the non-finite / dead-group report after it."""
    den = GaussianDenoiser(torch.float32)
    noise = sd.randn((3 * 8, D), seeds=0)
    counts = [count_host_reads(_runs(den, karras(n, 0.02, 20.0), noise)[method])[1] for n in (6, 14)]
    assert counts[0] == counts[1], counts
    assert counts[0] <= 10, counts


@pytest.mark.parametrize("method", ["best_of_n", "sir"])
def test_baselines_host_reads_do_not_grow_with_the_steps(method):
    den = GaussianDenoiser(torch.float32)
    noise = sd.randn((3 * 8, D), seeds=0)

    def run(n):
        kw = dict(particles=8, generator=3)
        if method == "sir":
            return sir(den, Linear(torch.ones(D)), noise, karras(n, 0.02, 20.0), alpha=1.0, **kw)
        return best_of_n(den, Linear(torch.ones(D)), noise, karras(n, 0.02, 20.0), **kw)

    counts = [count_host_reads(run, n)[1] for n in (6, 14)]
    assert counts[0] == counts[1], counts


def test_dead_group_on_the_device_path_is_raised_after_the_loop_with_the_host_paths_message(monkeypatch):
    """A group whose every particle gets a NaN reward at step 3: the host path stops there; the device path records
    it on the device and raises the same error (same step, group and sigma) after the loop."""
    den, sig = GaussianDenoiser(torch.float64), karras(8, 0.02, 20.0)
    noise = sd.randn((3 * 8, D), seeds=0, dtype=torch.float64)
    calls = []

    def reward(x):
        calls.append(1)
        r = x.flatten(1).sum(1)
        if len(calls) == 4:  # the fourth look-ahead (step 3): group 1 all NaN
            r = r.clone()
            r[8:16] = math.nan
        return r

    messages = {}
    for host in (True, False):
        calls.clear()
        monkeypatch.setattr(smc, "HOST_DECISIONS", host)
        with pytest.raises(FloatingPointError) as err:
            das(den, reward, noise, sig, alpha=1.0, particles=8, generator=0)
        messages[host] = str(err.value)
    assert "group 1" in messages[True] and "step 3" in messages[True]
    assert messages[True] == messages[False]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("method", ["das", "das_grad", "fk"])
def test_a_meta_run_keeps_every_per_step_tensor_on_the_models_device(method):
    """The model, the reward and the noise on ``meta`` with CPU generators (drawn on the CPU and moved, as diffusers
    does): any host read or CPU/meta mix inside the loop raises, and every per-step tensor the callback sees
    (particles, rewards, weights, ESS, ancestors) is on ``meta``. The run is stopped at its last step, before the
    one host read that reports non-finite particles."""
    steps, groups, p = 5, 2, 4
    den = GaussianDenoiser(torch.float32, "meta")
    noise = torch.randn(groups * p, D, device="meta")
    gens = [torch.Generator().manual_seed(i) for i in range(groups * p)]
    seen = []

    def callback(info):
        for key in ("x", "denoised", "reward", "log_weights", "ess", "lambda", "resampled", "ancestors"):
            if isinstance(info[key], torch.Tensor):
                seen.append(key)
                assert info[key].device.type == "meta", (key, info[key].device)
        if info["i"] == steps - 1:
            raise _Stop

    kw = dict(particles=p, generator=gens, batch_size=None, callback=callback)
    reward = DeviceReward("meta")
    sig = karras(steps, 0.02, 20.0)
    run = {"das": lambda: das(den, reward, noise, sig, alpha=1.0, **kw),
           "das_grad": lambda: das(den, lambda x: x.flatten(1).sum(1), noise, sig, alpha=1.0, gradient=True,
                                   tempering="exp", **kw),
           "fk": lambda: fk_steering(den, reward, noise, sig, alpha=1.0, **kw)}[method]
    with pytest.raises(_Stop):
        run()
    assert {"x", "reward", "log_weights", "ess", "ancestors"} <= set(seen)


HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("method", ["das", "fk", "sir", "best_of_n"])
def test_half_precision_runs_stay_in_the_models_dtype_and_match_float32(method, dtype):
    """A bf16 / fp16 model: the particles stay in its dtype (the denoiser asserts it) and the output is in it; the
    estimate agrees with the float32 run from the same noise and seeds.

    Truth: N(0, 0.5 I) in 4-D tilted by ``exp(1 . x)`` is ``N(v 1, v I)`` with ``v`` the chain's exact variance
    (``gaussian_chain_moments``). Tolerance: both runs share every draw, so they differ by rounding, not by Monte
    Carlo error, until a resampling decision flips; the sample mean over 256 samples has a standard error of
    ``sqrt(v / (256 * 4)) = 0.021``, and we allow 0.08 (four of them) between the runs and 0.12 to the truth
    (best-of-N targets max r, so only the agreement is checked for it)."""
    sig = karras(12, 0.02, 20.0)
    _, v = gaussian_chain_moments(VAR, sig)
    groups, p = 256, 4
    means = {}
    for dt in (torch.float32, dtype):
        den = GaussianDenoiser(dt)
        noise = sd.randn((groups * p, D), seeds=0, dtype=dt)
        kw = dict(particles=p, generator=5, batch_size=None)
        fn, tilted = {"das": (das, True), "fk": (fk_steering, True), "sir": (sir, True),
                      "best_of_n": (best_of_n, False)}[method]
        res = fn(den, Linear(torch.ones(D)), noise, sig, **({"alpha": 1.0} if tilted else {}), **kw)
        assert res.samples.dtype == dt and res.samples.shape == (groups, D)
        assert torch.isfinite(res.samples).all()
        means[dt] = float(res.samples.double().mean())
    assert abs(means[dtype] - means[torch.float32]) <= 0.08, means
    if method != "best_of_n":
        assert abs(means[dtype] - v) <= 0.12, (means, v)


def test_reward_guidance_host_reads_do_not_grow_with_the_steps():
    from steerdiff.align import reward_guidance

    den = GaussianDenoiser(torch.float32)
    noise = sd.randn((6, D), seeds=0)

    def run(n):
        return reward_guidance(den, Linear(torch.ones(D)), noise, karras(n, 0.02, 20.0), alpha=1.0, generator=3)

    counts = [count_host_reads(run, n)[1] for n in (6, 14)]
    assert counts[0] == counts[1], counts
