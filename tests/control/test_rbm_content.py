"""RB-Modulation's content/subject mode (steerdiff.control.RBModulation, ``content_descriptor=``; spec C.2, the
code's ``eval_sub_csd``).

Independent truths: the style-mode objective written out by hand (no content arguments, or ``lam_content = 0``,
must reproduce it bit for bit), gradient descent with a small step on a smooth toy cost (it must fall at every
inner step), a mask of zeros (no gradient there: those pixels of ``u`` cannot move), and the content cost written
out by hand.
"""

from __future__ import annotations

import pytest
import torch

import steerdiff as sd
from steerdiff.app.protocols.rbmod import BackwardCounter
from steerdiff.control import RBModulation
from steerdiff.control.styles import reference_image

SIGMAS = sd.sigmas.karras(12, 0.002, 40.0)


def _toy_content(seed=0, k=6):
    """A smooth toy content descriptor: a fixed random linear map of the flattened 8x8 image, then tanh."""
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(seed))
    return lambda x: torch.tanh(x.flatten(1) @ w / 8)


class OldRBM(RBModulation):
    """The style-mode objective as it stood before the subject mode, written out again."""

    def loss(self, u, x0_hat):
        prox = (u - x0_hat).pow(2).flatten(1).mean(dim=1)
        return self.lam_style * self.style_cost(u) + self.lam_prox * prox


def _sample(model, rbm, n=10, method="ddim"):
    return sd.sample(model, sd.randn((n, 1, 8, 8), seeds=0), SIGMAS, method=method, cond=torch.arange(n) % 10,
                     x0_corrector=rbm, generator=3)


@pytest.mark.parametrize("method", ["ddim", "ddpm"])
def test_default_and_zero_weight_are_bit_identical(model, psi, ref, method):
    base = dict(reference=ref, cost="squared", eta=0.2)
    old = _sample(model, OldRBM(psi, **base), method=method)
    subject = reference_image("normal", 3)
    for rbm in [RBModulation(psi, **base),
                RBModulation(psi, **base, content_descriptor=_toy_content(), content_reference=subject),
                RBModulation(psi, **base, content_descriptor=_toy_content(), content_reference=subject,
                             content_mask=torch.zeros(1, 1, 8, 8), lam_content=0.0)]:
        assert torch.equal(_sample(model, rbm, method=method), old)
    # and the content term does act when weighted
    on = RBModulation(psi, **base, content_descriptor=_toy_content(), content_reference=subject, lam_content=3.0)
    assert (_sample(model, on, method=method) - old).abs().max() > 1e-3


def test_content_cost_falls_over_inner_iterations(psi, ref):
    """Content only (lam_style = lam_prox = 0), a small Adam step: the toy content cost falls at every iteration
    and the recorded inner losses fall monotonically."""
    subject = reference_image("normal", 7)
    rbm = RBModulation(psi, reference=ref, M=12, eta=0.01, lam_style=0.0, lam_prox=0.0, record=True,
                       content_descriptor=_toy_content(), content_reference=subject, lam_content=1.0)
    rbm.begin([1.0, 0.0])
    start = reference_image("normal", 1).repeat(3, 1, 1, 1)
    u = rbm(start, start, 1.0, 0)
    losses = rbm.records[0].losses
    assert len(losses) == 13
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    with torch.no_grad():
        assert float(rbm.content_cost(u).mean()) == pytest.approx(losses[-1], rel=1e-5)
        assert float(rbm.content_cost(u).mean()) < 0.8 * float(rbm.content_cost(start).mean())


def test_content_cost_is_the_hand_written_cosine(psi, ref):
    desc = _toy_content(1)
    subject = reference_image("normal", 5)
    mask = torch.ones(1, 1, 8, 8)
    mask[..., :4] = 0.25
    rbm = RBModulation(psi, reference=ref, content_descriptor=desc, content_reference=subject, lam_content=2.0,
                       content_mask=mask)
    x = reference_image("thin", 2).repeat(2, 1, 1, 1)
    a, b = desc(x * mask), desc(subject)
    want = 1 - (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    torch.testing.assert_close(rbm.content_cost(x), want, rtol=1e-6, atol=1e-6)
    prox = torch.zeros(2)
    torch.testing.assert_close(rbm.loss(x, x), rbm.style_cost(x) + prox + 2.0 * want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("as_callable", [False, True], ids=["tensor", "callable"])
def test_mask_is_applied(psi, ref, as_callable):
    """Pixels where the mask is 0 get no content gradient: with only the content term they do not move."""
    mask = torch.ones(1, 1, 8, 8)
    mask[..., 4:, :] = 0.0
    seen = []

    def mask_fn(img):
        seen.append(img.requires_grad)
        return mask.expand_as(img)

    rbm = RBModulation(psi, reference=ref, M=3, eta=0.1, lam_style=0.0, lam_prox=0.0, lam_content=1.0,
                       content_descriptor=_toy_content(), content_reference=reference_image("normal", 4),
                       content_mask=mask_fn if as_callable else mask)
    rbm.begin([1.0, 0.0])
    d = reference_image("normal", 9).repeat(2, 1, 1, 1)
    u = rbm(d, d, 1.0, 0)
    assert torch.equal(u[..., 4:, :], d[..., 4:, :])
    assert (u[..., :4, :] - d[..., :4, :]).abs().max() > 1e-3
    if as_callable:
        assert seen and not any(seen)  # the callable sees the detached decoded estimate


def test_digits_content_head_pulls_towards_the_subject(model, psi, ref):
    """The shipped style CNN's content head as Psi_con on null-class samples: the content cost (its own measure)
    falls well below that of the style-only run, with no denoiser backward pass."""
    cnn = sd.models.load("digits_styles_cnn").eval().requires_grad_(False)
    subject = reference_image("normal", 3)
    kw = dict(reference=ref, cost="squared", eta=0.2, content_descriptor=cnn.content_logits,
              content_reference=subject)
    noise = sd.randn((10, 1, 8, 8), seeds=0)
    counter = BackwardCounter(model)
    try:
        runs = {lam: sd.sample(model, noise, SIGMAS, method="ddim", cond=None,
                               x0_corrector=RBModulation(psi, lam_content=lam, **kw)) for lam in (0.0, 3.0)}
    finally:
        counter.remove()
    assert counter.count == 0
    scorer = RBModulation(psi, lam_content=1.0, **kw)
    with torch.no_grad():
        cost = {lam: float(scorer.content_cost(x.clamp(-1, 1)).mean()) for lam, x in runs.items()}
    assert cost[3.0] < 0.5 * cost[0.0], cost


def test_bad_content_inputs(psi, ref):
    desc, subject = _toy_content(), reference_image("normal", 3)
    with pytest.raises(ValueError, match="a content_descriptor needs exactly one of content_reference="):
        RBModulation(psi, reference=ref, content_descriptor=desc, lam_content=1.0)
    with pytest.raises(ValueError, match="a content_descriptor needs exactly one"):
        RBModulation(psi, reference=ref, content_descriptor=desc, content_reference=subject,
                     content_embedding=torch.zeros(1, 6))
    with pytest.raises(ValueError, match="need a content_descriptor"):
        RBModulation(psi, reference=ref, content_reference=subject)
    with pytest.raises(ValueError, match="lam_content must be a finite number >= 0"):
        RBModulation(psi, reference=ref, content_descriptor=desc, content_reference=subject, lam_content=-1.0)
    with pytest.raises(ValueError, match=r"content_reference must be a floating-point latent .*got \(8,\)"):
        RBModulation(psi, reference=ref, content_descriptor=desc, content_reference=torch.zeros(8))
    with pytest.raises(TypeError, match="content_descriptor must be callable"):
        RBModulation(psi, reference=ref, content_descriptor="csd", content_reference=subject)
    # a content reference of another shape than the samples
    rbm = RBModulation(psi, reference=ref, content_descriptor=lambda x: x.flatten(1)[:, :4],
                       content_reference=torch.zeros(1, 1, 4, 4), lam_content=1.0)
    rbm.begin([3.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"content_reference has shape \[\*, 1, 4, 4\] but the samples are "
                                         r"\[B, 1, 8, 8\]"):
        rbm(torch.zeros(2, 1, 8, 8), torch.zeros(2, 1, 8, 8), 3.0, 0)
    # a content descriptor returning the wrong shape: on the reference, and on a batch
    with pytest.raises(ValueError, match=r"content_descriptor must return a floating-point embedding .*got \(1,\)"):
        RBModulation(psi, reference=ref, content_descriptor=lambda x: x.flatten(1).mean(1), content_reference=subject)
    calls = {"n": 0}

    def wrong_rows(x):
        calls["n"] += 1
        return desc(x) if calls["n"] == 1 else desc(x)[:1]

    rbm = RBModulation(psi, reference=ref, content_descriptor=wrong_rows, content_reference=subject, lam_content=1.0)
    rbm.begin([3.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"content_descriptor must return .*got \(1, 6\) for a batch of B=4"):
        rbm(torch.zeros(4, 1, 8, 8), torch.zeros(4, 1, 8, 8), 3.0, 0)
    rbm = RBModulation(psi, reference=ref, content_descriptor=desc, content_embedding=torch.zeros(1, 5),
                       lam_content=1.0)
    rbm.begin([3.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"content reference embedding has shape \(1, 5\)"):
        rbm(torch.zeros(4, 1, 8, 8), torch.zeros(4, 1, 8, 8), 3.0, 0)
    rbm = RBModulation(psi, reference=ref, content_descriptor=desc, content_reference=subject, lam_content=1.0,
                       content_mask=torch.ones(3, 8))
    rbm.begin([3.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"content_mask of shape \(3, 8\) does not broadcast"):
        rbm(torch.zeros(4, 1, 8, 8), torch.zeros(4, 1, 8, 8), 3.0, 0)
