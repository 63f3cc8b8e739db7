"""DiffDIS's cross-task attention starts (docs/methods/diffdis.md, "The edge task's contribution"): both rules start
as the identity, the zero gate leaves every weight of the branch without a gradient, the zero projection does not,
and only the latter learns a task that needs the other stream."""

from __future__ import annotations

import copy

import pytest
import torch

from steerdiff.models.precond import EDMPrecond
from steerdiff.segment import DBIA_INITS, CrossTaskAttention, DiffDISNet, FinetuneConfig, SegmentCond, build
from steerdiff.segment.diffdis import prior_unet


def _prior() -> EDMPrecond:
    torch.manual_seed(0)
    prior = EDMPrecond(prior_unet(8, 4, channels=(8, 16)), sigma_data=1.0)
    with torch.no_grad():  # the UNet's output conv starts at zero: give it weights so outputs are informative
        prior.net.conv_out.weight.normal_(0, 0.1)
        prior.net.conv_out.bias.normal_(0, 0.1)
    return prior


@pytest.mark.parametrize("rule", DBIA_INITS)
def test_both_starts_are_the_identity_and_the_network_is_the_prior(rule):
    torch.manual_seed(1)
    block = CrossTaskAttention(16, heads=2, init=rule)
    h = torch.randn(6, 16, 4, 4)
    torch.testing.assert_close(block(h), h, rtol=0, atol=0)
    # The whole network with the edge rows paired: the mask rows are the prior on the image latent (the default
    # condition_init), whatever the edge rows hold.
    prior = _prior().double()
    model = build(prior, 1.0, FinetuneConfig(dbia_init=rule))
    image = torch.randn(3, 4, 8, 8, dtype=torch.float64)
    c_noise = torch.tensor([-0.5, 0.1, 0.6], dtype=torch.float64)
    x = torch.randn(6, 4, 8, 8, dtype=torch.float64)
    out = model.net(x, torch.cat([c_noise, c_noise]), SegmentCond.for_images(image))
    torch.testing.assert_close(out[:3], prior.net(image, c_noise), rtol=0, atol=1e-12)


def _grads(rule: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(2)
    block = CrossTaskAttention(16, heads=2, init=rule)
    h = torch.randn(6, 16, 4, 4)
    block(h).pow(2).sum().backward()
    return {name: p.grad for name, p in block.named_parameters()}


def test_a_zero_gate_leaves_the_branch_without_gradient_and_a_zero_projection_does_not():
    """With ``gate = 0`` the output is ``h + 0 * branch``: every branch weight's gradient is exactly 0 (only the
    gate's is not). With ``proj = 0`` and ``gate = 1`` the projection's gradient is the attention output times the
    loss gradient, non-zero, while the weights before it wait (their gradient passes through ``proj = 0``)."""
    shut = _grads("gate")
    for name, g in shut.items():
        if name != "gate":
            assert g is None or torch.count_nonzero(g) == 0, name
    assert shut["gate"].abs() > 0
    open_ = _grads("zero_proj")
    assert open_["proj.weight"].abs().max() > 1e-3 and open_["proj.bias"].abs().max() > 1e-3
    assert torch.count_nonzero(open_["q.weight"]) == 0  # upstream of the zero projection, for one step


def _fit(rule: str, steps: int = 60, lr: float = 1e-2, channels: int = 8) -> tuple[float, float]:
    """Train one block, from its start, to match a teacher block of the same form with random weights and gate 1
    (an interaction the block can represent exactly); the mean loss of the first and of the last 5 steps."""
    torch.manual_seed(3)
    teacher = CrossTaskAttention(channels, heads=2)
    with torch.no_grad():
        teacher.gate.fill_(1.0)
    torch.manual_seed(5)
    block = CrossTaskAttention(channels, heads=2, init=rule)
    gen = torch.Generator().manual_seed(4)
    opt = torch.optim.Adam(block.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        h = torch.randn(8, channels, 2, 2, generator=gen)
        with torch.no_grad():
            target = teacher(h)
        loss = (block(h) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return float(sum(losses[:5]) / 5), float(sum(losses[-5:]) / 5)


def test_the_zero_projection_learns_an_interaction_the_zero_gate_does_not_reach():
    """Same teacher, data, optimiser (Adam 1e-3, near fine-tuning's 5e-4) and 100 steps: the open start fits the
    teacher's interaction (loss down more than 5x); the gated start, whose branch weights wait on a scalar that Adam
    moves by about the learning rate per step, ends several times higher."""
    first_open, last_open = _fit("zero_proj", 100, 1e-3)
    first_gate, last_gate = _fit("gate", 100, 1e-3)
    assert last_open < 0.2 * first_open
    assert last_open < 0.5 * last_gate
    assert first_gate > 0.5 * first_open  # both start from the identity: the teacher's branch is the first loss


def test_bad_rule_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="dbia_init"):
        DiffDISNet(copy.deepcopy(_prior().net), dbia_init="open")
    with pytest.raises(ValueError, match="init"):
        CrossTaskAttention(8, init="ones")
