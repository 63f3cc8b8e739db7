"""No host synchronisation inside the sampling loop (issue 36): host reads per trajectory do not grow with the steps.

On a GPU every read of a tensor value (``.item()``, ``float(t)``, ``bool(t)``) waits for the device. The CPU stand-in
is :class:`host_sync.HostSyncCounter`, which counts those reads at the ATen level; the finite check is forced to its
accelerator mode (``finite_check="end"``: one read after the loop), the default off the CPU. The denoisers here are
pure tensor arithmetic (no read of their own), so every read counted is the loop's.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from host_sync import HostSyncCounter, count_host_reads
from torch import nn

import steerdiff as sd
from steerdiff.core import SAMPLERS, FlowDenoiser, VPDenoiser
from steerdiff.core.calls import active_guard, finite_check, trajectory_check
from steerdiff.core.learned_solver import LearnedSolver
from steerdiff.guidance import APG, CFG, CFGRescale


def edm_like(x, sigma, cond=None):
    """A smooth denoiser of tensor ops only: ``x / (1 + sigma^2)``, shifted by the label (for guidance)."""
    out = x / (1 + sigma.view(-1, *([1] * (x.ndim - 1))) ** 2)
    if cond is not None:
        out = out + 0.1 * (cond.view(-1, *([1] * (x.ndim - 1))) + 1).to(x.dtype)
    return out


def _options(name: str) -> dict:
    return {"covariance": "zero"} if name.startswith("ocm-") else {}


def _schedule(name: str, steps: int):
    return sd.sigmas.vp_linear(steps) if name.startswith("ocm-") else sd.sigmas.karras(steps, 0.02, 20.0)


def reads_of_run(denoiser, name: str, steps: int, **kw) -> int:
    kw = {**_options(name), **kw}
    noise = sd.randn((3, 2), seeds=0)
    sigmas = _schedule(name, steps)  # built outside: vp_linear checks its (cached, host) table on first use
    if name == "learned":  # the learned solver at its initial value (DPM-Solver++ 2M) on this schedule
        kw["solver"] = LearnedSolver.dpmpp_2m(sigmas)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with HostSyncCounter() as counter:
            sd.sample(denoiser, noise, sigmas, method=name, generator=1, finite_check="end", **kw)
    return counter.reads


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_reads_per_trajectory_do_not_grow_with_steps(name):
    five, twenty = reads_of_run(edm_like, name, 5), reads_of_run(edm_like, name, 20)
    assert five == twenty, f"{name}: {five} host reads at 5 steps, {twenty} at 20"
    assert twenty <= 1, f"{name}: {twenty} host reads per trajectory (only the final finite check may read)"


@pytest.mark.parametrize("cov", ["oracle", "bad_function", "beta"])
@pytest.mark.parametrize("name", ["ocm-ddpm", "ocm-ddim"])
def test_ocm_kernels_read_nothing_per_step(name, cov):
    """The OCM kernels with a state-dependent covariance (the exact mixture's), one whose values need clamping
    (negative and NaN: the clamp counts add up on the device) and a closed form; the exact mixture is the denoiser.
    The clamp counts are read after the loop with ``host_copy(...).tolist()``, which the CPU counter does not see
    (a plain memory read): on an accelerator it is the run's one wait, with the finite flag's."""
    from steerdiff.models import builtin_mixture

    gm = builtin_mixture("gmm2d")
    source = {"oracle": gm, "beta": "beta",
              "bad_function": lambda x, s, c: torch.where(x > 0, -0.1, float("nan")) * torch.ones_like(x)}[cov]
    assert reads_of_run(gm, name, 5, covariance=source) == reads_of_run(gm, name, 20, covariance=source) <= 1


def test_exact_mixture_reads_nothing():
    """:class:`GaussianMixture` without a condition: no read per call (its sigma = inf limit is a select, not a
    test of the levels), so a sampler over it reads only its final finite check. (A condition on the CPU is checked
    on the host, free there; on a device it is not read: the next test.)"""
    from steerdiff.models import builtin_mixture

    gm = builtin_mixture("gmm16d")
    x = sd.randn((4, 16), seeds=0)
    sigma = torch.tensor([float("inf"), 2.0, 0.5, 0.0])
    _, reads = count_host_reads(gm, x, sigma)
    assert reads == 0
    for name in ("heun", "dpmpp_2m_sde", "unipc"):
        assert reads_of_run(builtin_mixture("gmm2d"), name, 5) == reads_of_run(builtin_mixture("gmm2d"), name, 20) <= 1


def test_exact_mixture_on_a_device_reads_nothing():
    """On a device (``meta`` stands in for one: reading it fails) the mixture computes there, the condition
    included: no copy to the host and no read of the condition's validity (a row matching no component gives NaN,
    which the sampler's finite check reports)."""
    from steerdiff.models import builtin_mixture

    gm = builtin_mixture("gmm2d")
    x, cond = torch.empty(3, 2, device="meta"), torch.empty(3, dtype=torch.int64, device="meta")
    sigma = torch.empty(3, device="meta")
    for out in (gm(x, sigma, cond), gm.posterior_cov(x, sigma, cond), gm.log_prob(x, sigma, cond)):
        assert out.device.type == "meta"
    from steerdiff.covariance.kernel import mixture_diag_cov

    assert mixture_diag_cov(gm, x, sigma, cond).shape == (3, 2)


def test_exact_mixture_refuses_an_unmatched_condition_on_the_host():
    from steerdiff.models import builtin_mixture

    with pytest.raises(ValueError, match=r"cond\[1\]=\[9\] matches no component"):
        builtin_mixture("gmm2d")(torch.zeros(2, 2), torch.ones(2), torch.tensor([0, 9]))


def test_stochastic_samplers_with_eta_read_nothing_per_step():
    for name in ("ddim", "euler_ancestral", "dpmpp_2m_sde"):
        assert reads_of_run(edm_like, name, 5, eta=0.5) == reads_of_run(edm_like, name, 20, eta=0.5) <= 1


def test_callback_progress_corrector_and_stats_read_nothing_per_step():
    seen = []

    def run(steps):
        return reads_of_run(edm_like, "heun", steps, callback=lambda d: seen.append(d["sigma"]), progress=True,
                            x0_corrector=lambda d, x, s, i: 0.9 * d, return_stats=True)

    assert run(5) == run(20) <= 1
    assert all(isinstance(s, float) for s in seen)  # the callback gets host numbers, not tensors


@pytest.mark.parametrize("make", [
    lambda: CFG(3.0), lambda: CFG([1.0, 2.0, 3.0]), lambda: CFG(2.0, start=0.2, stop=0.8), lambda: APG(3.0),
    lambda: APG(3.0, space="eps", momentum=-0.5), lambda: CFGRescale(3.0, space="eps"),
    lambda: (lambda dc, du, x, s: du + 2.0 * (dc - du)),
], ids=["cfg", "cfg_per_sample", "cfg_window", "apg", "apg_eps", "cfg_rescale_eps", "combiner"])
def test_guiders_read_nothing_per_step(make):
    cond = torch.tensor([0, 1, 0])
    # A per-sample weight is read once (its host copy), not per step: at most that read and the final check.
    five = reads_of_run(edm_like, "euler", 5, cond=cond, guidance=make())
    twenty = reads_of_run(edm_like, "euler", 20, cond=cond, guidance=make())
    assert five == twenty <= 2


def _vp_denoiser():
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    net = lambda x, t, cond=None: 0.1 * x + 1e-4 * t.view(-1, 1)  # noqa: E731
    return VPDenoiser(net, torch.cumprod(1 - betas, 0))


def _flow_denoiser(prediction="velocity"):
    return FlowDenoiser(lambda x_t, t, cond=None: 0.5 * x_t - 1e-3 * t.view(-1, 1), prediction=prediction)


@pytest.mark.parametrize("make", [_vp_denoiser, _flow_denoiser, lambda: _flow_denoiser("eps")],
                         ids=["vp", "flow", "flow_eps"])
def test_wrappers_fast_paths_read_nothing(make):
    d = make()
    top = 80.0 if isinstance(d, FlowDenoiser) else d.sigma_max
    noise = sd.randn((3, 2), seeds=0)

    def reads(steps):
        sig = sd.sigmas.karras(steps, 0.05, top)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with HostSyncCounter() as c:
                sd.sample(d, noise, sig, method="heun", finite_check="end")
        return c.reads

    # VPDenoiser's sigma_range reads its host (CPU) table twice per run, in the schedule check: no device read.
    assert reads(5) == reads(20) <= (3 if isinstance(d, VPDenoiser) else 1)


def test_tagged_sigma_batch_takes_the_fast_path_off_the_cpu():
    """The samplers' sigma batches carry their level on the host: a denoiser reads it without the tensor (which on
    an accelerator would be a device read). ``meta`` tensors stand in for a device (reading one fails)."""
    x = torch.empty(3, 2, device="meta")
    sb = sd.core.sigma_batch(x, 0.1)
    assert sb.device.type == "meta" and sb.dtype == torch.float32 and sb.shape == (3,)
    level = sd.core.denoiser.host_level(sb)
    assert level == float(torch.tensor(0.1, dtype=torch.float32))  # the value the tensor holds, read on the CPU
    assert sd.core.denoiser.host_level(torch.full((3,), 0.1, device="meta")) is None  # untagged: never read
    sb.mul_(2.0)  # changed in place: the tag no longer holds
    assert sd.core.denoiser.host_level(sb) is None


def test_sampling_under_inference_mode():
    """Inference tensors keep no version counter: the tag works without it, and the result is the same."""
    d, noise = _vp_denoiser(), sd.randn((3, 2), seeds=0)
    sig = sd.sigmas.karras(6, 0.05, 50.0)
    expected = sd.sample(d, noise, sig, method="heun")
    with torch.inference_mode():
        got = sd.sample(d, noise, sig, method="heun", finite_check="end")
    assert torch.equal(got, expected)


def _nan_from(step_sigma):
    calls = []

    def bad(x, sigma, cond=None):
        calls.append(float(sigma[0]))
        out = x.clone()
        if float(sigma[0]) < step_sigma:
            out[1] = float("nan")
        return out

    return bad, calls


@pytest.mark.parametrize("mode", ["end", "step", "auto"])
def test_nan_at_step_k_names_step_k(mode):
    bad, calls = _nan_from(1.0)
    sig = torch.tensor([4.0, 2.0, 0.5, 0.1, 0.0])
    with pytest.raises(FloatingPointError, match=r"step 2 \(sigma=0.5\) for 1 of 3 samples"):
        sd.sample(bad, torch.randn(3, 2), sig, method="euler", finite_check=None if mode == "auto" else mode)
    # "step" (and "auto" on the CPU) stop at the bad call; "end" runs the trajectory out, then names the first.
    assert len(calls) == (4 if mode == "end" else 3)


def test_nan_with_the_deferred_check_set_for_a_block():
    bad, calls = _nan_from(1.0)
    # Heun's second evaluation of step 1 is at sigma 0.5: the first bad output is step 1's, as "step" mode names it.
    with finite_check("end"), pytest.raises(FloatingPointError, match=r"step 1 \(sigma=0.5\)"):
        sd.sample(bad, torch.randn(3, 2), torch.tensor([4.0, 2.0, 0.5, 0.1, 0.0]), method="heun")
    assert len(calls) > 3  # deferred: the run went on past the bad step


def test_a_model_failing_on_the_nan_it_got_reports_the_nan():
    """In "end" mode a later step sees the NaN; a model that raises on it is reported as the first bad output."""

    def fragile(x, sigma, cond=None):
        if not bool(torch.isfinite(x).all()):
            raise RuntimeError("non-finite input")
        out = x.clone()
        if float(sigma[0]) < 1.0:
            out[0] = float("inf")
        return out

    with pytest.raises(FloatingPointError, match=r"step 2 \(sigma=0.5\) for 1 of 2 samples") as info:
        sd.sample(fragile, torch.randn(2, 2), torch.tensor([4.0, 2.0, 0.5, 0.1, 0.0]), method="euler",
                  finite_check="end")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_non_finite_corrector_deferred():
    sig = torch.tensor([4.0, 2.0, 0.5, 0.0])

    def corrector(d, x, s, i):
        return d * math.inf if i == 1 else d

    for mode in ("end", "step"):
        with pytest.raises(FloatingPointError, match=r"x0_corrector returned non-finite values at step 1"):
            sd.sample(edm_like, torch.randn(2, 2), sig, method="euler", x0_corrector=corrector, finite_check=mode)


def test_finite_check_modes_give_identical_samples():
    from steerdiff.models import builtin_mixture

    gm = builtin_mixture("gmm2d")
    noise = sd.randn((4, 2), seeds=3)
    for name in ("heun", "dpmpp_2m_sde", "unipc"):
        runs = [sd.sample(gm, noise, sd.sigmas.karras(6, 0.02, 20.0), method=name, generator=5, finite_check=m)
                for m in ("step", "end")]
        assert torch.equal(runs[0], runs[1])


def test_finite_check_refuses_unknown_mode():
    with pytest.raises(ValueError, match="finite_check must be one of"):
        sd.sample(edm_like, torch.randn(2, 2), sd.sigmas.karras(3, 0.1, 10.0), finite_check="never")
    with pytest.raises(ValueError, match="finite_check must be one of"):
        with finite_check("sometimes"):
            pass


def test_trajectory_check_auto_mode_follows_the_device():
    with trajectory_check("cpu"):
        assert not active_guard().deferred
    with trajectory_check("meta"):  # any device but the CPU: deferred
        assert active_guard().deferred
    with finite_check("end"), trajectory_check("cpu"):
        assert active_guard().deferred
    assert active_guard() is None


# ------------------------------------------------------------------------------------------------ torch.compile
class TinyNet(nn.Module):
    """A small conv network ``net(x, t, cond)`` in VP units (timestep-conditioned)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 1, 3, padding=1)
        self.embed = nn.Linear(1, 8)

    def forward(self, x, t, cond=None):
        h = self.conv1(x) + self.embed(t.view(-1, 1) / 1000.0).view(-1, 8, 1, 1)
        return self.conv2(torch.nn.functional.silu(h))


@pytest.mark.parametrize("what", ["vp_net", "whole_denoiser"])
def test_compiled_model_does_not_recompile_across_steps(what):
    """A compiled network inside ``sd.sample`` compiles once: the sigma / t it gets is a ``[B]`` tensor of one dtype
    on the state's device at every step (``error_on_recompile`` turns a recompilation into an error)."""
    import torch._dynamo

    torch.manual_seed(0)
    net = TinyNet().eval()
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    abar = torch.cumprod(1 - betas, 0)
    noise = sd.randn((2, 1, 8, 8), seeds=0)
    sig = sd.sigmas.karras(10, 0.05, 20.0)
    torch._dynamo.reset()
    if what == "vp_net":
        eager = VPDenoiser(net, abar)
        compiled = VPDenoiser(torch.compile(net, backend="eager", fullgraph=True), abar)
    else:
        def edm(x, sigma, cond=None):  # an EDM-style wrapper computed from the sigma tensor
            s = sigma.view(-1, 1, 1, 1)
            c_in = 1 / (1 + s**2).sqrt()
            return x - s * net(x * c_in, 250.0 * sigma.log(), cond)

        eager, compiled = edm, torch.compile(edm, backend="eager", fullgraph=True)
    expected = sd.sample(eager, noise, sig, method="dpmpp_2m")
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        got = sd.sample(compiled, noise, sig, method="dpmpp_2m")
        got_heun = sd.sample(compiled, noise, sig, method="heun")  # a second run and sampler: still no recompile
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got_heun).all()


# ------------------------------------------------------------------------------------------------ on a GPU
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("name", [n for n in sorted(SAMPLERS) if not n.startswith("ocm-")])
def test_cuda_sample_has_no_sync(name):
    """The whole ``sd.sample`` under ``torch.cuda.set_sync_debug_mode("error")``: every sampler, plain and guided,
    through the VP and flow wrappers' fast paths (the end-of-run read waits on an event, which it does not flag)."""
    noise = sd.randn((3, 2), seeds=0, device="cuda")
    cond = torch.tensor([0, 1, 0], device="cuda")
    vp, flow = _vp_denoiser(), _flow_denoiser()
    runs = [(edm_like, {}), (edm_like, {"cond": cond, "guidance": CFG(3.0)}),
            (edm_like, {"cond": cond, "guidance": APG(3.0, space="eps")}), (vp, {}), (flow, {})]
    for d, kw in runs:
        top = d.sigma_max if isinstance(d, VPDenoiser) else 20.0
        sig = sd.sigmas.karras(8, 0.05, top)
        if name == "learned":
            kw = {**kw, "solver": LearnedSolver.dpmpp_2m(sig)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = sd.sample(d, noise.cpu(), sig, method=name, generator=1,
                                 **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = sd.sample(d, noise, sig, method=name, generator=1, **kw)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert got.device.type == "cuda"
        if not SAMPLERS.get(name).stochastic(SAMPLERS.get(name).default_eta):  # CUDA noise differs from the CPU's
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("name", ["ocm-ddpm", "ocm-ddim"])
def test_cuda_ocm_and_exact_mixture_have_no_sync(name):
    """The OCM kernels over the exact mixture (denoiser and oracle covariance) on CUDA, conditioned, under
    ``set_sync_debug_mode("error")``. A first run outside the mode copies the mixture's tables to the device
    (once per device: a blocking host-to-device copy)."""
    from steerdiff.models import builtin_mixture

    gm = builtin_mixture("gmm2d")
    noise = sd.randn((3, 2), seeds=0, device="cuda")
    cond = torch.tensor([0, 1, 2], device="cuda")
    sig = sd.sigmas.vp_linear(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sd.sample(gm, noise, sig, method=name, covariance=gm, cond=cond, generator=1)  # the one-off copies
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = sd.sample(gm, noise, sig, method=name, covariance=gm, cond=cond, generator=1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert got.device.type == "cuda" and torch.isfinite(got).all()


def test_host_copy_of_a_cpu_tensor_is_itself():
    t = torch.ones(2)
    assert sd.core.calls.host_copy(t) is t
