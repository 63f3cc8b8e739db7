"""The OCM reverse kernel as a loop of public pieces: core's checked call, then :func:`gaussian_step`."""

import pytest
import torch

import steerdiff as sd
from steerdiff.core import SampleNoise, denoise_checked, make_generators
from steerdiff.core.calls import sigma_batch
from steerdiff.core.sigmas import vp_linear
from steerdiff.covariance import as_covariance
from steerdiff.covariance.kernel import clamp_covariance, gaussian_step
from steerdiff.models import GaussianMixture

GMM = GaussianMixture([0.4, 0.6], [[-1.0, 0.5], [1.0, -0.5]], [[0.2, 0.1], [0.3, 0.4]])


@pytest.mark.parametrize("method,eta", [("ocm-ddpm", None), ("ocm-ddim", 0.0), ("ocm-ddim", 0.5)])
def test_a_loop_of_gaussian_steps_is_the_registered_ocm_sampler(method, eta):
    kw = {} if eta is None else {"eta": eta}
    noise = sd.randn((7, 2), seeds=0, dtype=torch.float64)
    sig = vp_linear(6)
    want = sd.sample(GMM, noise, sig, method=method, covariance=GMM, generator=3, **kw)

    s_list = sig.tolist()
    rng = SampleNoise(make_generators(3, 7, noise.device))
    x = noise * s_list[0]
    src = as_covariance(GMM)
    with src.bind(GMM) as cov_fn:
        for i in range(len(s_list) - 1):
            t, s = s_list[i], s_list[i + 1]
            d = denoise_checked(lambda z, sb, step=None: GMM(z, sb, None), x, t, i)
            if s == 0:
                x = d
                break
            c, _, _ = clamp_covariance(cov_fn(x, sigma_batch(x, t), None, d).to(x.dtype), src.c_max)
            x = gaussian_step(x, d, t, s, c, kind=method[4:], eta=eta or 0.0, noise=rng)
    assert torch.equal(x, want)


def test_gaussian_step_adds_no_noise_where_the_variance_is_zero():
    x, d = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)

    class NoDraws:
        def randn_like(self, t):
            raise AssertionError("drew noise")

    out = gaussian_step(x, d, 2.0, 1.0, torch.zeros_like(x), kind="ddim", eta=0.0, noise=NoDraws())
    torch.testing.assert_close(out, d + 0.5 * (x - d))  # DDIM eta = 0 with c = 0: the Euler step
    capped = gaussian_step(x, d, 2.0, 1.0, torch.full_like(x, 100.0), kind="ddpm", eta=0.0,
                           noise=SampleNoise(make_generators(0, 3, "cpu")), var_max=1e-12)
    assert (capped - (d + 0.25 * (x - d))).abs().max() < 1e-5  # the variance clip bounds the noise


def test_gaussian_step_takes_the_zero_covariance_from_the_host():
    """``c_zero`` (what the loops pass, from the covariance source) decides the draw without reading ``c``: True
    draws nothing, False draws even for an all-zero ``c`` (``0 * z``: the state is the same, the generators move)."""
    from host_sync import count_host_reads

    x, d = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)

    class Draws:
        n = 0

        def randn_like(self, t):
            self.n += 1
            return torch.randn_like(t)

    rng = Draws()
    zero = torch.zeros_like(x)
    out, reads = count_host_reads(gaussian_step, x, d, 2.0, 1.0, zero, kind="ddim", eta=0.0, noise=rng, c_zero=True)
    assert reads == 0 and rng.n == 0 and torch.equal(out, torch.lerp(d, x, 0.5))
    out, reads = count_host_reads(gaussian_step, x, d, 2.0, 1.0, zero, kind="ddim", eta=0.0, noise=rng, c_zero=False)
    assert reads == 0 and rng.n == 1 and torch.equal(out, torch.lerp(d, x, 0.5))
