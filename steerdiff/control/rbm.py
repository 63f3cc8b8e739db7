"""RB-Modulation's stochastic-optimal-control corrector: a few Adam steps on the denoised estimate towards a reference
style, taken at every sampler step (RB-Modulation, Rout et al., ICLR 2025; docs/methods/rb_modulation.md
"The controller").

The reverse SDE is read as a controlled process whose terminal cost is the style distance between the final image and
a reference. Since the terminal state is unknown mid-trajectory, the controller substitutes Tweedie's estimate
``x0-hat = D(x, sigma)`` and, at step ``i`` of ``N`` (for ``i < tau``), solves the terminal problem on it::

    u = x0-hat;  Adam([u], lr = eta (1 - i / N))          # a fresh optimiser every step
    repeat M times:
        L = lam_style * cost(Psi(Dec(u)), Psi(Dec(x0_ref))) + lam_prox * mean((u - x0-hat)^2)
            [+ lam_content * content_cost(Psi_con(mask * Dec(u)), Psi_con(Dec(x0_content)))]   # subject mode
        step
    x0-hat <- u       # reentry="consistent" (default): eps-hat from u;  "official": eps-hat keeps the uncorrected D

Gradients flow through the decoder and the style descriptor only, never through the denoiser (no network backward:
what makes the method cheap). :class:`RBModulation` is an ``x0_corrector`` of :func:`steerdiff.sample`, so every
core sampler runs it; the sampler uses ``u`` as ``x0-hat`` (:func:`steerdiff.core.sampling.apply_x0_corrector`).

Differences from the official code (``google/RB-Modulation``, ``gdf_rbm.py``), all deliberate:

* the re-entry (docs/methods/rb_modulation.md, "Re-entry"): by default ``eps-hat`` is formed from the corrected
  ``u`` as well (for DDIM ``x' = u + (sigma'/sigma)(x - u)``: the step the sampler takes when the denoiser's
  prediction is ``u``), where the official code keeps ``eps-hat`` of the uncorrected ``D`` (``x' = u +
  (sigma'/sigma)(x - D)``, ``reentry="official"``). Measured over 24 generator x noise seeds on the digits protocol
  (docs/methods/rb_modulation.md, "The class-accuracy gap: what was checked"), the consistent re-entry passes the
  class-accuracy criterion in 20 and reproduces the protocol's calibration; the official one passes in 2;

* the loss of a batch is the *sum* of per-sample losses (the code takes the batch mean); Adam is invariant to the
  gradient's scale (up to its ``eps``), so the steps agree, and a sample no longer depends on its batch;
* the cost is a choice: ``"cosine"`` (``1 - cos``, the code's CSD cost), ``"squared"`` (``1/2 ||e - ref||^2``, the
  paper's form; for L2-normalised embeddings exactly twice the cosine cost) or any callable;
* CFG is whatever guidance :func:`steerdiff.sample` runs (its per-sample rescale, not the code's whole-batch std);
  the "pushforward" of the code is not implemented;
* the content/subject mode (the code's ``eval_sub_csd``) takes any content descriptor ``Psi_con`` (the code: CSD's
  content head) and an optional ``content_mask`` (a tensor, or a callable of the detached decoded estimate) that
  multiplies ``Dec(u)`` before ``Psi_con``: the place of the code's LangSAM segmentation of the prediction
  (``use_attn_mask``). No segmentation model ships; mask the subject image yourself before passing it (the code's
  ``sam_mask`` on the subject). The code applies its LangSAM mask only for a batch of one; here any batch.

The plain gradient-guidance baseline (docs/methods/rb_modulation.md "Usage") is :func:`style_guidance`, a
:class:`steerdiff.guidance.RewardGuidance` on the same terminal cost through the denoiser.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.optim import Adam

from ..guidance.reward import RewardGuidance

COSTS = ("cosine", "squared")
REENTRIES = ("consistent", "official")
Cost = Callable[[Tensor, Tensor], Tensor]


def cosine_cost(e: Tensor, ref: Tensor) -> Tensor:
    """``1 - cos(e_b, ref_b)`` per row ``[B]`` (the official code's CSD style cost)."""
    return 1.0 - torch.nn.functional.cosine_similarity(e, ref.expand_as(e), dim=1, eps=1e-12)


def squared_cost(e: Tensor, ref: Tensor) -> Tensor:
    """``1/2 ||e_b - ref_b||^2`` per row ``[B]`` (the paper's terminal cost)."""
    return 0.5 * (e - ref.expand_as(e)).pow(2).sum(dim=1)


def _as_cost(cost: str | Cost) -> Cost:
    if callable(cost):
        return cost
    if cost == "cosine":
        return cosine_cost
    if cost == "squared":
        return squared_cost
    raise ValueError(f"cost must be one of {COSTS} or a callable cost(e [B, k], ref [1 or B, k]) -> [B], got {cost!r}")


def _identity(x: Tensor) -> Tensor:
    return x


def check_embedding(e, n: int, what: str, name: str = "descriptor") -> Tensor:
    """``e`` must be a floating tensor ``[n, k]``: a descriptor's (named ``name``) output for a batch of ``n``."""
    if not isinstance(e, Tensor) or e.ndim != 2 or e.shape[0] != n or not e.is_floating_point():
        got = tuple(e.shape) if isinstance(e, Tensor) else type(e).__name__
        raise ValueError(f"{name} must return a floating-point embedding [B, k] (one row per image), got {got} "
                         f"for {what} of B={n}")
    return e


def _check_count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _check_weight(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass
class StepRecord:
    """What the corrector did at one sampler step: the index, noise level, Adam learning rate and the inner losses
    (batch means) before each of the ``M`` Adam steps, then at the final ``u`` (``M + 1`` values)."""

    i: int
    sigma: float
    lr: float
    losses: list[float] = field(default_factory=list)


class RBModulation:
    """RB-Modulation's SOC controller as an ``x0_corrector`` of :func:`steerdiff.sample` (docs/methods/rb_modulation.md
    "The controller").

    Usage::

        rbm = RBModulation(descriptor, reference=x_ref, eta=0.2)
        x = sd.sample(denoiser, noise, sigmas, method="ddim", cond=cond, x0_corrector=rbm)

    Args:
        descriptor: the style descriptor ``Psi(images [B, ...]) -> [B, k]``, differentiable (the code's CSD).
        decoder: ``Dec(latent) -> image`` before the descriptor (the code's previewer; None: the identity, for a
            pixel-space model). Differentiable.
        M: Adam steps per sampler step (0: plain sampling).
        eta: the initial Adam learning rate (> 0); step ``i`` of ``N`` uses ``eta (1 - i / N)``. In the latent's
            units: scale it with the latent's standard deviation.
        lam_style: weight of the style cost (0: plain sampling, whatever ``lam_prox``).
        lam_prox: weight of the proximal term ``mean((u - x0-hat)^2)`` (the control energy; the code's
            ``lam_txt_alignment``).
        tau: correct steps ``i < tau`` only (None: every step).
        reference: the reference latent ``x0_ref`` ``[1 or B, *shape]`` (its embedding ``Psi(Dec(x0_ref))`` is
            computed once, without gradient); or give ``reference_embedding``.
        reference_embedding: the reference embedding ``[1 or B, k]`` itself.
        cost: ``"cosine"`` (``1 - cos``, default), ``"squared"`` (``1/2 ||e - ref||^2``) or ``cost(e, ref) -> [B]``.
        record: keep a :class:`StepRecord` per corrected step in :attr:`records` (costs one more descriptor
            evaluation per step, for the final loss).
        content_descriptor: the subject mode's content descriptor ``Psi_con(images [B, ...]) -> [B, k']`` (the
            code's CSD content head), differentiable; None (default): style mode only.
        content_reference: the subject latent ``x0_content`` ``[1 or B, *shape]`` (the sample's shape; its content
            embedding ``Psi_con(Dec(x0_content))`` is computed once, without gradient); or give
            ``content_embedding`` ``[1 or B, k']``.
        lam_content: weight of the content cost (0, the default, or no content descriptor: the style mode,
            bit-identical to a controller built without these arguments).
        content_mask: multiplies ``Dec(u)`` before ``Psi_con`` (not before ``Psi``): a tensor broadcastable to the
            decoded image, or ``mask(decoded [B, ...]) -> tensor`` called on the detached decoded estimate at every
            inner step (the code's LangSAM mask of the prediction; no segmentation model ships with steerdiff).
        content_cost: the content cost, as ``cost`` (default ``"cosine"``, the code's).
        reentry: how the sampler re-enters after the correction: ``"consistent"`` (default; ``eps-hat`` from ``u``,
            a departure from the official code, see the module docstring) or ``"official"`` (``eps-hat`` from the
            uncorrected ``D``, as the official code).

    Raises:
        ValueError: ``eta <= 0``, an unknown ``reentry``, a negative or non-integer ``M`` / ``tau``, a negative
            weight, no reference or both, a content descriptor without a content reference (or a content reference
            without a descriptor, or both reference forms), a content reference that is not a floating latent
            ``[1 or B, *shape]``, or (when called) a descriptor output that is not ``[B, k]``, a content reference
            whose shape differs from the sample's, a mask that does not broadcast to the decoded image.
    """

    def __init__(self, descriptor: Callable[[Tensor], Tensor], decoder: Callable[[Tensor], Tensor] | None = None,
                 M: int = 3, eta: float = 0.1, lam_style: float = 1.0, lam_prox: float = 1.0, tau: int | None = None,
                 *, reference: Tensor | None = None, reference_embedding: Tensor | None = None,
                 cost: str | Cost = "cosine", record: bool = False,
                 content_descriptor: Callable[[Tensor], Tensor] | None = None, content_reference: Tensor | None = None,
                 content_embedding: Tensor | None = None, lam_content: float = 0.0,
                 content_mask: Tensor | Callable[[Tensor], Tensor] | None = None,
                 content_cost: str | Cost = "cosine", reentry: str = "consistent"):
        if not callable(descriptor):
            raise TypeError(f"descriptor must be callable images [B, ...] -> embeddings [B, k], got "
                            f"{type(descriptor).__name__}")
        if decoder is not None and not callable(decoder):
            raise TypeError(f"decoder must be callable latent -> image or None, got {type(decoder).__name__}")
        if isinstance(eta, bool) or not isinstance(eta, numbers.Real) or not math.isfinite(eta) or eta <= 0:
            raise ValueError(f"eta (the Adam learning rate of the SOC steps) must be a finite number > 0, got {eta!r}; "
                             "use M=0 or lam_style=0 to switch the control off")
        if reentry not in REENTRIES:
            raise ValueError(f"reentry must be one of {list(REENTRIES)} (eps-hat from the corrected u, or from the "
                             f"uncorrected D as the official code), got {reentry!r}")
        self.reentry = reentry
        self.descriptor = descriptor
        self.decoder = decoder if decoder is not None else _identity
        self.M = _check_count(M, "M")
        self.eta = float(eta)
        self.lam_style = _check_weight(lam_style, "lam_style")
        self.lam_prox = _check_weight(lam_prox, "lam_prox")
        self.tau = None if tau is None else _check_count(tau, "tau")
        self.cost = _as_cost(cost)
        self.record = bool(record)
        if (reference is None) == (reference_embedding is None):
            raise ValueError("give exactly one of reference= (the reference latent x0_ref [1 or B, *shape]) and "
                             "reference_embedding= (its descriptor embedding [1 or B, k])")
        if reference is not None:
            if not isinstance(reference, Tensor) or reference.ndim < 2 or not reference.is_floating_point():
                raise ValueError("reference must be a floating-point latent [1 or B, *shape]")
            with torch.no_grad():
                emb = self.descriptor(self.decoder(reference))
            reference_embedding = check_embedding(emb, reference.shape[0], "the reference")
        elif not isinstance(reference_embedding, Tensor) or reference_embedding.ndim != 2:
            got = (tuple(reference_embedding.shape) if isinstance(reference_embedding, Tensor)
                   else type(reference_embedding).__name__)
            raise ValueError(f"reference_embedding must be a tensor [1 or B, k], got {got}")
        self.reference_embedding = reference_embedding.detach()
        self._init_content(content_descriptor, content_reference, content_embedding, lam_content, content_mask,
                           content_cost)
        self.steps: int | None = None
        self.records: list[StepRecord] = []

    def _init_content(self, descriptor, reference, embedding, lam_content, mask, cost) -> None:
        """Check and store the subject mode's arguments (see the class docstring)."""
        self.lam_content = _check_weight(lam_content, "lam_content")
        if descriptor is not None and not callable(descriptor):
            raise TypeError(f"content_descriptor must be callable images [B, ...] -> embeddings [B, k] or None, got "
                            f"{type(descriptor).__name__}")
        if mask is not None and not (callable(mask) or isinstance(mask, Tensor)):
            raise TypeError(f"content_mask must be a tensor, a callable decoded -> mask, or None, got "
                            f"{type(mask).__name__}")
        given = (reference is not None) + (embedding is not None)
        if descriptor is None:
            if given or mask is not None:
                raise ValueError("content_reference / content_embedding / content_mask need a content_descriptor "
                                 "(the subject mode's Psi_con)")
        elif given != 1:
            raise ValueError("a content_descriptor needs exactly one of content_reference= (the subject latent "
                             "x0_content [1 or B, *shape]) and content_embedding= (its content embedding [1 or B, k])")
        self.content_descriptor = descriptor
        self.content_mask = mask
        self.content_cost_fn = _as_cost(cost)
        self.content_shape: tuple[int, ...] | None = None
        self.content_embedding: Tensor | None = None
        if descriptor is None:
            return
        if reference is not None:
            if not isinstance(reference, Tensor) or reference.ndim < 2 or not reference.is_floating_point():
                got = tuple(reference.shape) if isinstance(reference, Tensor) else type(reference).__name__
                raise ValueError(f"content_reference must be a floating-point latent [1 or B, *shape] (the sample's "
                                 f"shape), got {got}")
            self.content_shape = tuple(reference.shape[1:])
            with torch.no_grad():
                emb = descriptor(self.decoder(reference))  # the subject is not masked here: mask it beforehand
            embedding = check_embedding(emb, reference.shape[0], "the content reference", "content_descriptor")
        elif not isinstance(embedding, Tensor) or embedding.ndim != 2 or not embedding.is_floating_point():
            got = tuple(embedding.shape) if isinstance(embedding, Tensor) else type(embedding).__name__
            raise ValueError(f"content_embedding must be a floating-point tensor [1 or B, k], got {got}")
        self.content_embedding = embedding.detach()

    @property
    def content_active(self) -> bool:
        """Whether the content term enters the loss: a content descriptor and ``lam_content > 0``."""
        return self.content_descriptor is not None and self.lam_content > 0

    def begin(self, sigmas: list[float]) -> None:
        """Start a run on the schedule ``sigmas`` (``N = len(sigmas) - 1`` steps; :func:`steerdiff.sample` calls
        it)."""
        self.steps = len(sigmas) - 1
        self.records = []

    def lr_at(self, i: int) -> float:
        """The Adam learning rate of step ``i``: ``eta (1 - i / N)`` (the official code's decay)."""
        if self.steps is None:
            raise RuntimeError("RBModulation needs the run's schedule: pass it to sd.sample(..., x0_corrector=rbm) or "
                               "call rbm.begin(sigmas) first")
        return self.eta * (1.0 - i / self.steps)

    def style_cost(self, x0: Tensor) -> Tensor:
        """``cost(Psi(Dec(x0)), ref)`` per row ``[B]``, differentiable in ``x0``."""
        e = check_embedding(self.descriptor(self.decoder(x0)), x0.shape[0], "a batch")
        ref = self.reference_embedding.to(device=e.device, dtype=e.dtype)
        if ref.shape[1] != e.shape[1] or ref.shape[0] not in (1, e.shape[0]):
            raise ValueError(f"descriptor returned embeddings of shape {tuple(e.shape)} but the reference embedding "
                             f"has shape {tuple(ref.shape)}; expected [1 or B, {e.shape[1]}]")
        return self.cost(e, ref)

    def _masked(self, image: Tensor) -> Tensor:
        """``mask * image``: the content mask (a tensor, or a callable of the detached image) applied."""
        mask = self.content_mask
        if mask is None:
            return image
        if callable(mask) and not isinstance(mask, Tensor):
            mask = mask(image.detach())
            if not isinstance(mask, Tensor):
                raise ValueError(f"content_mask must return a tensor, got {type(mask).__name__}")
        mask = mask.detach().to(device=image.device, dtype=image.dtype)
        try:
            if torch.broadcast_shapes(mask.shape, image.shape) != image.shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(f"content_mask of shape {tuple(mask.shape)} does not broadcast to the decoded image "
                             f"{tuple(image.shape)}") from None
        return image * mask

    def content_cost(self, x0: Tensor) -> Tensor:
        """``content_cost(Psi_con(mask * Dec(x0)), Psi_con(Dec(x0_content)))`` per row ``[B]``, differentiable in
        ``x0`` (the subject mode's term, without its weight)."""
        if self.content_descriptor is None:
            raise RuntimeError("content_cost needs a content_descriptor (the subject mode)")
        if self.content_shape is not None and tuple(x0.shape[1:]) != self.content_shape:
            raise ValueError(f"content_reference has shape [*, {', '.join(map(str, self.content_shape))}] but the "
                             f"samples are [B, {', '.join(map(str, x0.shape[1:]))}]: give the subject in the sample's "
                             "shape")
        e = check_embedding(self.content_descriptor(self._masked(self.decoder(x0))), x0.shape[0], "a batch",
                            "content_descriptor")
        ref = self.content_embedding.to(device=e.device, dtype=e.dtype)
        if ref.shape[1] != e.shape[1] or ref.shape[0] not in (1, e.shape[0]):
            raise ValueError(f"content_descriptor returned embeddings of shape {tuple(e.shape)} but the content "
                             f"reference embedding has shape {tuple(ref.shape)}; expected [1 or B, {e.shape[1]}]")
        return self.content_cost_fn(e, ref)

    def loss(self, u: Tensor, x0_hat: Tensor) -> Tensor:
        """The inner objective per row ``[B]``: ``lam_style cost + lam_prox mean((u - x0_hat)^2)``, plus
        ``lam_content content_cost`` in the subject mode."""
        prox = (u - x0_hat).pow(2).flatten(1).mean(dim=1)
        out = self.lam_style * self.style_cost(u) + self.lam_prox * prox
        if self.content_active:  # skipped otherwise: the style mode stays bit-identical
            out = out + self.lam_content * self.content_cost(u)
        return out

    def active(self, i: int, sigma: float) -> bool:
        """Whether step ``i`` is corrected: ``M > 0``, ``i < tau`` and ``sigma > 0``. ``lam_style = 0`` still runs the
        Adam steps; they stay at ``x0-hat`` (zero gradient of the proximal term there: zero Adam step)."""
        return self.M > 0 and (self.tau is None or i < self.tau) and sigma > 0

    def __call__(self, denoised: Tensor, x: Tensor, sigma: float, i: int) -> Tensor:
        """The corrected estimate ``u*`` of step ``i`` (``denoised`` itself when the step is not corrected)."""
        if not self.active(i, float(sigma)):
            return denoised
        lr = self.lr_at(i)
        x0_hat = denoised.detach()
        rec = StepRecord(i=i, sigma=float(sigma), lr=lr) if self.record else None
        with torch.enable_grad():
            u = x0_hat.clone().requires_grad_(True)
            opt = Adam([u], lr=lr)  # fresh optimiser state at every sampler step
            for _ in range(self.M):
                per_row = self.loss(u, x0_hat)
                opt.zero_grad(set_to_none=True)
                per_row.sum().backward()  # rows are independent: the sum's gradient is each row's own
                opt.step()
                if rec is not None:
                    rec.losses.append(float(per_row.detach().mean()))
            if rec is not None:
                with torch.no_grad():
                    rec.losses.append(float(self.loss(u, x0_hat).mean()))
                self.records.append(rec)
        return u.detach().to(denoised.dtype)


def style_reward(descriptor: Callable[[Tensor], Tensor], decoder: Callable[[Tensor], Tensor] | None = None, *,
                 reference: Tensor | None = None, reference_embedding: Tensor | None = None,
                 cost: str | Cost = "cosine") -> Callable[[Tensor], Tensor]:
    """The reward ``r(x0) = -cost(Psi(Dec(x0)), ref)`` ``[B]`` of the same terminal cost RB-Modulation optimises."""
    rbm = RBModulation(descriptor, decoder, reference=reference, reference_embedding=reference_embedding, cost=cost)

    def reward(x0: Tensor) -> Tensor:
        return -rbm.style_cost(x0)

    return reward


def style_guidance(descriptor: Callable[[Tensor], Tensor], w: float, decoder: Callable[[Tensor], Tensor] | None = None,
                   *, reference: Tensor | None = None, reference_embedding: Tensor | None = None,
                   cost: str | Cost = "cosine") -> RewardGuidance:
    """Plain gradient guidance with RB-Modulation's terminal cost through the denoiser (the baseline of
    docs/methods/rb_modulation.md "Usage"): ``D_g = D - w sigma^2 grad_x L_sty(Dec(D(x)))``, i.e.
    :class:`~steerdiff.guidance.RewardGuidance` with ``kind="clean"`` on :func:`style_reward` (one denoiser VJP per
    step). Pass it as ``guidance=`` (with ``cond=``)."""
    reward = style_reward(descriptor, decoder, reference=reference, reference_embedding=reference_embedding,
                          cost=cost)
    return RewardGuidance(reward, rho=w, kind="clean")
