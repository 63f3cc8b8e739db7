"""Core's one checked model call (steerdiff.core.calls) and the per-step updates the registered samplers loop over."""

import math

import pytest
import torch

import steerdiff as sd
from steerdiff.core import (
    SampleNoise,
    apply_x0_corrector,
    checked_call,
    ddim_step,
    ddpm_step,
    denoise_step,
    dpmpp_2m_sde_step,
    dpmpp_2m_step,
    euler_ancestral_step,
    euler_step,
    heun_step,
    make_generators,
    register_sampler,
)
from steerdiff.core.calls import ModelCall, sigma_batch
from steerdiff.core.registry import SAMPLERS
from steerdiff.models import GaussianMixture

GMM = GaussianMixture([0.3, 0.7], [[-1.0, 2.0], [1.5, -0.5]], [[0.2, 0.3], [0.4, 0.1]])
SIG = sd.sigmas.karras(7, 0.02, 30.0)
SIG_INF = torch.cat([torch.tensor([math.inf], dtype=torch.float64), sd.sigmas.karras(6, 0.02, 30.0)])


def _noise(seed=0):
    return sd.randn((9, 2), seeds=seed, dtype=torch.float64)


def _by_steps(method, sigmas, eta=None, corrector=None):
    """The same run as sd.sample, written as a loop over core's public step functions."""
    sig = sigmas.tolist()
    noise = _noise()
    x = noise if math.isinf(sig[0]) else noise * sig[0]
    rng = SampleNoise(make_generators(7, noise.shape[0], noise.device))

    def model(z, s, step=None):
        return GMM(z, s, None)

    old, h_last = None, math.nan  # the multistep solvers' history
    for i in range(len(sig) - 1):
        s, s_next = sig[i], sig[i + 1]
        x, d = denoise_step(model, x, s, i, corrector)
        if method == "dpmpp_2m":
            x, h_last = dpmpp_2m_step(x, d, s, s_next, old, h_last)
        elif method == "dpmpp_2m_sde":
            x, h_last = dpmpp_2m_sde_step(x, d, s, s_next, eta, rng, old, h_last)
        old = None if math.isinf(s) else d
        if method.startswith("dpmpp"):
            continue
        if method == "euler":
            x = euler_step(x, d, s, s_next)
        elif method == "heun":
            x = heun_step(model, x, d, s, s_next, i)
        elif method == "ddim":
            x = ddim_step(x, d, s, s_next, eta, rng)
        elif method == "ddpm":
            x = ddpm_step(x, d, s, s_next, rng)
        else:
            x = euler_ancestral_step(x, d, s, s_next, eta, rng)
    return x


CASES = [("euler", None), ("heun", None), ("ddim", 0.0), ("ddim", 0.6), ("ddpm", None), ("euler_ancestral", 1.0),
         ("euler_ancestral", 0.3), ("dpmpp_2m", None), ("dpmpp_2m_sde", 0.0), ("dpmpp_2m_sde", 0.7)]


@pytest.mark.parametrize("method,eta", CASES)
@pytest.mark.parametrize("sigmas", [SIG, SIG_INF], ids=["finite", "inf"])
def test_a_loop_of_core_steps_is_the_registered_sampler(method, eta, sigmas):
    kw = {} if eta is None else {"eta": eta}
    want = sd.sample(GMM, _noise(), sigmas, method=method, generator=7, **kw)
    assert torch.equal(_by_steps(method, sigmas, eta), want)


def test_the_x0_corrector_is_an_argument_of_the_step():
    def corrector(d, x, s, i):
        return 0.8 * d + 0.1 * x

    want = sd.sample(GMM, _noise(), SIG, method="ddim", eta=0.6, generator=7, x0_corrector=corrector)
    assert torch.equal(_by_steps("ddim", SIG, 0.6, corrector), want)
    plain = sd.sample(GMM, _noise(), SIG, method="ddim", eta=0.6, generator=7)
    assert not torch.allclose(want, plain)
    # The step reads only its argument: a corrector left on the model as an attribute is not applied.
    x, d = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)

    def model(z, s, step=None):
        return d

    model.x0_corrector = corrector
    assert denoise_step(model, x, 1.0, 0)[1] is d
    state, u = denoise_step(model, x, 1.0, 0, corrector)
    torch.testing.assert_close(u, corrector(d, x, 1.0, 0))
    torch.testing.assert_close(state, x + (u - d))  # eps-hat of the uncorrected D is kept
    assert apply_x0_corrector(None, x, d, 1.0, 0) == (x, d)
    state_inf, _ = apply_x0_corrector(corrector, x, d, math.inf, 0)
    assert state_inf is x  # at sigma = inf the state is the unit noise and stays


def test_correct_x0_is_deprecated_and_still_reads_the_attribute():
    x, d = torch.ones(2, 2), torch.zeros(2, 2)

    def model(z, s, step=None):
        return d

    model.x0_corrector = lambda dd, xx, s, i: dd + 1.0
    with pytest.warns(DeprecationWarning, match="apply_x0_corrector"):
        _, u = sd.core.correct_x0(model, x, d, 1.0, 0)
    assert torch.equal(u, torch.ones(2, 2))


def test_a_corrector_sampler_must_take_the_argument():
    name = "test-calls-no-corrector-arg"

    @register_sampler(name, corrector=True)
    def old_style(model, x, sigmas, callback=None, progress=False, **_):  # relies on a model attribute
        return x

    try:
        with pytest.raises(TypeError, match="x0_corrector= argument"):
            sd.sample(GMM, _noise(), SIG, method=name, x0_corrector=lambda d, x, s, i: d)
    finally:
        SAMPLERS.remove(name)


def test_checked_call_names_step_and_sigma():
    x = torch.randn(5, 3)

    def nan_rows(z, s):
        out = z.clone()
        out[1:3] = float("nan")
        return out

    with pytest.raises(FloatingPointError, match=r"step 4 \(sigma=0\.25\) for 2 of 5 samples"):
        checked_call(nan_rows, x, 0.25, 4)
    out = checked_call(nan_rows, x, 0.25, 4, finite=False)  # loops that guard rows themselves
    assert out.isnan().sum() == 6
    with pytest.raises(ValueError, match=r"shape \(5,\), expected the input's shape \(5, 3\) at step 2"):
        checked_call(lambda z, s: z[:, 0], x, 0.5, 2)

    def refuses(z, s):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match=r"bad input \(at step 3 \(sigma=0\.5"):
        checked_call(refuses, x, 0.5, 3)
    # The level goes to the model in at least float32, and the output comes back in the state's dtype.
    seen = {}

    def spy(z, s):
        seen["sigma"] = s
        return z.double()

    half = torch.zeros(2, 2, dtype=torch.float16)
    assert checked_call(spy, half, 0.002, 0).dtype == torch.float16
    assert seen["sigma"].dtype == torch.float32 and seen["sigma"].shape == (2,)
    assert float(seen["sigma"][0]) == pytest.approx(0.002, rel=1e-7)
    assert sigma_batch(torch.zeros(3, 1, dtype=torch.float64), 1.5).dtype == torch.float64


def test_model_call_counts_and_cuts_micro_batches():
    x = torch.randn(7, 2, dtype=torch.float64)
    cond = torch.arange(7)
    sizes = []

    def den(z, s, c):
        sizes.append((z.shape[0], None if c is None else c.tolist()))
        return GMM(z, s, None)

    call = ModelCall(den, batch_size=3)
    out = call(x, 0.7, cond, step=0)
    assert torch.equal(out, GMM(x, torch.full((7,), 0.7, dtype=torch.float64), None))
    assert [n for n, _ in sizes] == [3, 3, 1] and sizes[2][1] == [6]  # the condition is cut with the rows
    assert call.denoiser.calls == 3 and call.denoiser.rows == 7 and call.time > 0
    whole = ModelCall(den)
    assert torch.equal(whole(x, 0.7), out) and whole.denoiser.calls == 1
    # A caller may choose the cuts (a sharded population's); None falls back to batch_size.
    custom = ModelCall(den, batch_size=4, chunks=lambda n: [slice(0, 5), slice(5, n)] if n == 7 else None)
    assert custom.chunks(7) == [slice(0, 5), slice(5, 7)] and custom.chunks(6) == [slice(0, 4), slice(4, 6)]
    # Non-finite outputs: raised (naming the step) unless the caller guards them.
    with pytest.raises(FloatingPointError, match="step 5"):
        ModelCall(lambda z, s, c: z * math.nan)(x, 0.7, None, 5)
    assert ModelCall(lambda z, s, c: z * math.nan, finite=False)(x, 0.7).isnan().all()
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ModelCall(den, batch_size=0)
