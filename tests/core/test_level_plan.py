"""The sigma batches and the network timesteps made before the loop (``core.denoiser.LevelPlan``, issue 36: the
loop's own work per step): the same values as the batches a loop makes per step, none made inside the loop, and
none handed out again once a model has changed one in place.

Independent truth: the schedule itself (the levels as float32 holds them), ``t = sigma / (1 + sigma)`` computed by
tensor ops, the same run with models that keep no reference to their inputs, and ATen ops counted by a dispatch mode.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import steerdiff as sd
from steerdiff.core.flow import FlowDenoiser
from steerdiff.guidance import CFG


class Recorder:
    """A conditional denoiser ``D = x / (1 + sigma^2) + 0.1 cond`` that records a copy of every sigma batch it is
    given and, with ``mutate``, then overwrites the batch in place."""

    def __init__(self, mutate: bool):
        self.mutate, self.seen = mutate, []

    def __call__(self, x, sigma, cond=None):
        self.seen.append(sigma.clone())
        s = sigma.view(-1, 1)
        out = x / (1 + s * s) + 0.1 * cond.view(-1, 1).to(x.dtype)
        if self.mutate:
            sigma.fill_(123.0)
        return out


def _levels(sig, method):
    """The level of each model call of ``method`` on the schedule ``sig``."""
    lv = sig.tolist()
    if method == "euler":
        return lv[:-1]
    out = []
    for s, s_next in zip(lv[:-1], lv[1:], strict=True):
        out += [s] if s_next == 0 else [s, s_next]
    return out


@pytest.mark.parametrize("method", ["euler", "heun"])
@pytest.mark.parametrize("guided", [False, True])
def test_each_call_sees_its_level_even_after_a_model_overwrote_a_batch(method, guided):
    sig = sd.sigmas.karras(5, 0.05, 10.0)
    noise = sd.randn((3, 2), seeds=0)
    cond = torch.tensor([0, 1, 1])
    runs = {}
    for mutate in (False, True):
        rec = Recorder(mutate)
        x = sd.sample(rec, noise, sig, method=method, cond=cond, guidance=CFG(2.0) if guided else None)
        runs[mutate] = (x, rec.seen)
    expected = _levels(sig, method)
    for mutate, (_, seen) in runs.items():
        assert len(seen) == len(expected), mutate
        for s, level in zip(seen, expected, strict=True):
            assert torch.equal(s, torch.full_like(s, level)), (mutate, level)  # float32 as new_full rounds it
    assert torch.equal(runs[False][0], runs[True][0])


class TimeRecorder(torch.nn.Module):
    """A flow velocity network that records its timesteps and then overwrites them in place (with ``mutate``)."""

    def __init__(self, mutate: bool):
        super().__init__()
        self.mutate, self.seen = mutate, []

    def forward(self, x_t, t, cond=None):
        self.seen.append(t.clone())
        v = x_t * (t / 1000.0).view(-1, 1) - 0.5
        if self.mutate:
            t.zero_()
        return v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flow_timesteps_are_t_of_each_level_even_after_a_network_overwrote_them(dtype):
    sig = sd.sigmas.flow(6)  # starts at inf: that level's timestep comes from the tensor path
    noise = sd.randn((2, 2), seeds=1, dtype=dtype)
    outs = {}
    for mutate in (False, True):
        net = TimeRecorder(mutate)
        outs[mutate] = sd.sample(FlowDenoiser(net, t_scale=1000.0), noise, sig, method="euler")
        levels = torch.tensor(sig.tolist()[:-1], dtype=dtype)
        t = torch.where(levels.isinf(), torch.ones_like(levels), levels / (levels + 1))
        assert len(net.seen) == len(levels)
        for got, want in zip(net.seen, t * 1000.0, strict=True):
            assert got.dtype == dtype
            assert torch.equal(got, want.expand(2)), mutate
    assert torch.equal(outs[False], outs[True])


class _CountFull(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in ("aten::full", "aten::new_full", "aten::fill_"):
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["flow", "vp"])
def test_no_sigma_or_timestep_batch_is_made_per_step_on_the_cpu(kind):
    if kind == "flow":
        den = FlowDenoiser(lambda x_t, t, cond: x_t * (t / 1000.0).view(-1, 1) + 0.1 * cond.view(-1, 1).float())
        make = sd.sigmas.flow
    else:
        ac = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
        den = sd.core.vp.VPDenoiser(lambda x, t, cond: x * 0.1 + t.view(-1, 1) * 1e-4 + cond.view(-1, 1).float(), ac)
        make = lambda n: sd.sigmas.karras(n, 0.1, 10.0)  # noqa: E731
    noise = sd.randn((2, 3), seeds=0)
    cond = torch.tensor([0, 1])
    counts = []
    for steps in (12, 6):
        sig = make(steps)
        sd.sample(den, noise, sig, method="euler", cond=cond, guidance=CFG(3.0))  # warm: levels' numbers cached
        with _CountFull() as mode:
            sd.sample(den, noise, sig, method="euler", cond=cond, guidance=CFG(3.0))
        counts.append(mode.n)
    assert counts[0] == counts[1]  # fills made per trajectory, not per step


def test_inference_mode_samples_as_no_grad():
    sig = sd.sigmas.karras(5, 0.05, 10.0)
    noise = sd.randn((3, 2), seeds=0)
    cond = torch.tensor([0, 1, 1])
    with torch.no_grad():
        ref = sd.sample(Recorder(False), noise, sig, method="heun", cond=cond, guidance=CFG(2.0))
    with torch.inference_mode():
        x = sd.sample(Recorder(True), noise, sig, method="heun", cond=cond, guidance=CFG(2.0))
    assert torch.equal(x, ref)
