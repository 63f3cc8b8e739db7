"""Guiders inside the samplers: every method, trained-style networks, the diffusers adapter, start/stop windows,
per-trajectory reset and NFE accounting."""

import pytest
import torch

import steerdiff as sd
from steerdiff.core import NFECounter, nfe_of
from steerdiff.guidance import APG, CFG, CFGRescale
from steerdiff.models import MLP, EDMPrecond, builtin_mixture

METHODS = ["euler", "heun", "ddim", "ddpm"]
GUIDERS = {
    "cfg": lambda: CFG(4.0),
    "rescale": lambda: CFGRescale(4.0, phi=0.7),
    "apg": lambda: APG(4.0, eta=0.0, r_rms=0.5, momentum=-0.5),
}


@pytest.fixture(scope="module")
def gmm2d():
    return builtin_mixture("gmm2d")  # 8 labelled components on a ring


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(GUIDERS))
def test_every_sampler(gmm2d, method, name):
    steps, n = 16, 32  # heun with strong CFG needs ~10+ steps on this sharp mixture (it diverges at 6)
    noise = sd.randn((n, 2), seeds=0, dtype=torch.float64)
    cond = torch.arange(n) % 8
    x, st = sd.sample(gmm2d, noise, sd.sigmas.karras(steps), method=method, cond=cond, guidance=GUIDERS[name](),
                      generator=1, return_stats=True)
    assert x.shape == (n, 2) and x.dtype == torch.float64 and torch.isfinite(x).all()
    assert st.nfe == 2 * nfe_of(method, steps)
    # Guided samples still land in their class: the nearest component is the requested one for most rows.
    assert (torch.cdist(x, gmm2d.means).argmin(1) == cond).double().mean() >= 0.9


@pytest.mark.parametrize("name", list(GUIDERS))
def test_reset_per_trajectory_and_batch_independence(gmm2d, name):
    """Two runs with one guider object agree (the sampler resets the state); a sample ignores its batch."""
    g = GUIDERS[name]()
    noise = sd.randn((16, 2), seeds=0, dtype=torch.float64)
    cond = torch.arange(16) % 8
    sig = sd.sigmas.karras(8)
    a = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=g)
    b = sd.sample(gmm2d, noise, sig, method="euler", cond=cond, guidance=g)
    assert torch.equal(a, b)
    part = sd.sample(gmm2d, noise[3:7], sig, method="euler", cond=cond[3:7], guidance=g)
    torch.testing.assert_close(part, a[3:7], rtol=1e-10, atol=1e-12)


def test_momentum_would_leak_without_reset(gmm2d):
    """Direct calls (no sampler) keep the buffer; reset() clears it."""
    apg = APG(4.0, momentum=-0.5)
    x, sigma, cond = torch.randn(4, 2, dtype=torch.float64), torch.full((4,), 2.0, dtype=torch.float64), torch.arange(4)
    first = apg.guide(gmm2d, x, sigma, cond)
    second = apg.guide(gmm2d, x, sigma, cond)
    assert not torch.allclose(first, second)
    apg.reset()
    assert torch.equal(apg.guide(gmm2d, x, sigma, cond), first)


@pytest.mark.parametrize("num_classes", [3, [3, 2]])
@pytest.mark.parametrize("name", list(GUIDERS))
def test_tiny_network(num_classes, name):
    """A random-weight conditional MLP behind EDM preconditioning: shapes, dtypes, cost; [B] and [B, m] labels."""
    torch.manual_seed(0)
    net = EDMPrecond(MLP(dim=2, hidden=[16], num_classes=num_classes)).eval()
    n = 10
    cond = torch.arange(n) % 3 if num_classes == 3 else torch.stack([torch.arange(n) % 3, torch.arange(n) % 2], 1)
    with torch.no_grad():
        x, st = sd.sample(net, sd.randn((n, 2), seeds=0), sd.sigmas.karras(4), method="heun", cond=cond,
                          guidance=GUIDERS[name](), return_stats=True)
    assert x.shape == (n, 2) and x.dtype == torch.float32 and torch.isfinite(x).all()
    assert st.nfe == 2 * nfe_of("heun", 4)


def test_diffusers_adapter():
    """A tiny class-conditional diffusers UNet (class 3 = null) through from_diffusers, under every guider."""
    diffusers = pytest.importorskip("diffusers")
    from steerdiff.models.diffusers_adapter import from_diffusers

    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16),
        norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
        num_class_embeds=4,
    ).eval()
    sched = diffusers.DDIMScheduler()
    den = from_diffusers(unet, sched, null_class=3)
    sig = sd.sigmas.from_alphas_cumprod(sched.alphas_cumprod, 3, "leading", 1)
    cond = torch.tensor([0, 1, 2, 0])
    for name, make in GUIDERS.items():
        with torch.no_grad():
            x, st = sd.sample(den, sd.randn((4, 1, 8, 8), seeds=0), sig, method="ddim", cond=cond, guidance=make(),
                              return_stats=True)
        assert x.shape == (4, 1, 8, 8) and torch.isfinite(x).all(), name
        assert st.nfe == 6
    # Without a null class the adapter refuses the null batch, with its own clear message.
    with pytest.raises(ValueError, match="null_class="):
        sd.sample(from_diffusers(unet, sched), sd.randn((4, 1, 8, 8), seeds=0), sig, method="ddim", cond=cond,
                  guidance=CFG(3.0))


# --- start / stop ---------------------------------------------------------------------------------------------
def _euler_reference(den, noise, sig, cond, guided_steps, scale):
    """Euler by hand: CFG on the listed step indices, the conditional model elsewhere."""
    x = noise * sig[0]
    for i in range(len(sig) - 1):
        s = torch.full((x.shape[0],), float(sig[i]), dtype=x.dtype)
        if i in guided_steps:
            d_c, d_u = den(x, s, cond), den(x, s, torch.full_like(cond, -1))
            d = d_u + scale * (d_c - d_u)
        else:
            d = den(x, s, cond)
        x = d + float(sig[i + 1]) / float(sig[i]) * (x - d)
    return x


@pytest.mark.parametrize("start,stop,guided", [(0.25, 0.75, range(2, 6)), (0.0, 0.5, range(0, 4)),
                                               (0.5, 1.0, range(4, 8)), (0.3, 0.35, range(2, 2))])
def test_start_stop_window(gmm2d, start, stop, guided):
    """diffusers' rule: guided iff int(start N) <= i < int(stop N); outside, D_c at one evaluation."""
    steps, n = 8, 16
    sig = sd.sigmas.karras(steps)
    noise = sd.randn((n, 2), seeds=3, dtype=torch.float64)
    cond = torch.arange(n) % 8
    counter = NFECounter(gmm2d)
    g = CFG(5.0, start=start, stop=stop, sigmas=sig)
    x = sd.sample(counter, noise, sig, method="euler", cond=cond, guidance=g)
    assert counter.rows == n * (steps + len(guided))
    torch.testing.assert_close(x, _euler_reference(gmm2d, noise, sig, cond, set(guided), 5.0), rtol=1e-10, atol=1e-12)


def test_outside_window_is_cond_at_one_evaluation(gmm2d):
    sig = sd.sigmas.karras(10)
    x, cond = torch.randn(6, 2, dtype=torch.float64), torch.arange(6)
    for g in (CFG(5.0), CFGRescale(5.0), APG(5.0)):
        g.start, g.stop = 0.3, 0.6
        g.set_schedule(sig)
        for i, expect_guided in [(0, False), (2, False), (3, True), (5, True), (6, False), (9, False)]:
            counter = NFECounter(gmm2d)
            s = torch.full((6,), float(sig[i]), dtype=torch.float64)
            out = g.guide(counter, x, s, cond)
            if expect_guided:
                assert counter.calls == 1 and counter.rows == 12
                assert not torch.allclose(out, gmm2d(x, s, cond))
            else:
                assert counter.calls == 1 and counter.rows == 6
                assert torch.equal(out, gmm2d(x, s, cond))


def test_window_needs_schedule_and_keeps_momentum_still(gmm2d):
    x, cond, s = torch.randn(4, 2, dtype=torch.float64), torch.arange(4), torch.full((4,), 1.0, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="set_schedule"):
        APG(3.0, start=0.2).guide(gmm2d, x, s, cond)
    sig = sd.sigmas.karras(10)
    apg = APG(3.0, start=0.5, sigmas=sig)
    apg.guide(gmm2d, x, torch.full((4,), float(sig[0]), dtype=torch.float64), cond)  # outside: no update
    assert apg.momentum_buffer is None
    apg.guide(gmm2d, x, torch.full((4,), float(sig[5]), dtype=torch.float64), cond)
    assert apg.momentum_buffer is not None


def test_disabled_and_w1_cost_one_evaluation(gmm2d):
    noise, cond, sig = sd.randn((8, 2), seeds=0, dtype=torch.float64), torch.arange(8), sd.sigmas.karras(5)
    plain = sd.sample(gmm2d, noise, sig, method="heun", cond=cond)
    for g in (CFG(3.0, enabled=False), CFG(1.0), CFGRescale(1.0), APG(1.0)):
        x, st = sd.sample(gmm2d, noise, sig, method="heun", cond=cond, guidance=g, return_stats=True)
        assert st.nfe == nfe_of("heun", 5) and torch.equal(x, plain)


def test_window_under_heun(gmm2d):
    """heun's second evaluation of step i (at sigmas[i + 1]) is guided when step i + 1 is."""
    steps, n = 8, 4
    sig = sd.sigmas.karras(steps)
    counter = NFECounter(gmm2d)
    g = CFG(3.0, start=0.25, stop=0.75, sigmas=sig)  # steps 2..5
    sd.sample(counter, sd.randn((n, 2), seeds=0, dtype=torch.float64), sig, method="heun", cond=torch.arange(n),
              guidance=g)
    # first evaluations: steps 2..5 guided; second evaluations of steps 1..4 guided (step 7 has none)
    assert counter.rows == n * (nfe_of("heun", steps) + 4 + 4)
