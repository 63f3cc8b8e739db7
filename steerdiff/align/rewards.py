"""Rewards ``r(x0) -> [B]`` for alignment: combinators, exact quadratic rewards, and rewards for the shipped models.

A reward is any callable ``r(x0) -> [B]``, differentiable for DAS's proposal and reward guidance. Here:

* :class:`WeightedSum` / :func:`multi_objective`: ``r_w = sum_m w_m r_m`` (the DAS paper's multi-objective setting;
  ``components`` reports each ``r_m``); a list of ``(weight, reward)`` pairs passed to a sampler becomes one.
* :class:`Quadratic`: ``r(x) = -1/2 x^T A x + h^T x + r0`` with its exact tilt of a Gaussian mixture
  (the validation problems, ``docs/methods/das.md``).
* Digits (``steerdiff.models.load("digits_classifier")``): :class:`ClassLogProb` (log-probability of a target
  class), :func:`ink` (mean intensity), :func:`symmetry` (left-right mirror agreement); :func:`from_spec` parses
  the CLI strings ``class:3``, ``ink``, ``symmetry``, ``linear:1,0`` and weighted sums ``0.5*class:3+ink``, and
  :func:`check_reward_shape` checks a reward's size against the model's samples before any sampling;
  :func:`heldout_digits_classifier` is an independent classifier for cross rewards.
* Shapes: attribute log-probabilities need a shipped shapes classifier head per attribute; no shapes model ships
  yet, so none is offered (``ClassLogProb(classifier, target, head=k)`` already supports a multi-head classifier).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


class WeightedSum:
    """``r(x) = sum_m w_m r_m(x)``; gradients add up. ``components(x)`` gives ``[M, B]``."""

    def __init__(self, terms: Sequence[tuple[float, Callable]]):
        terms = list(terms)
        if not terms:
            raise ValueError("a weighted sum needs at least one (weight, reward) pair")
        for t in terms:
            if not (isinstance(t, (tuple, list)) and len(t) == 2 and isinstance(t[0], (int, float))
                    and callable(t[1])):
                raise TypeError(f"rewards must be (weight, callable) pairs, got {t!r}")
        self.terms = [(float(w), r) for w, r in terms]

    def __call__(self, x: Tensor) -> Tensor:
        total = None
        for w, r in self.terms:
            if w == 0:
                continue
            v = w * r(x)
            total = v if total is None else total + v
        return total if total is not None else x.new_zeros(x.shape[0]) + 0 * x.flatten(1).sum(1)

    def components(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.stack([r(x) for _, r in self.terms])


def multi_objective(r1: Callable, r2: Callable, w: float, scale2: float = 1.0) -> WeightedSum:
    """The paper's two-objective scalarisation ``w r1 + (1 - w) scale2 r2`` (aesthetic + 20 CLIPScore there)."""
    if not 0 <= w <= 1:
        raise ValueError(f"w must lie in [0, 1], got {w}")
    return WeightedSum([(w, r1), ((1 - w) * scale2, r2)])


def as_reward(reward) -> Callable:
    """A callable reward, or a list of ``(weight, reward)`` pairs turned into their :class:`WeightedSum`."""
    if callable(reward):
        return reward
    if isinstance(reward, (list, tuple)):
        return WeightedSum(reward)
    raise TypeError(f"reward must be a callable r(x0) -> [B] or a list of (weight, reward) pairs, "
                    f"got {type(reward).__name__}")


class Quadratic:
    """``r(x) = -1/2 x^T A x + h^T x + r0`` on flattened samples, with its exact Gaussian-mixture tilt.

    ``Quadratic.around(A, c, b)`` builds ``-1/2 (x - c)^T A (x - c) + b^T x`` (h = A c + b, r0 = -1/2 c^T A c).
    """

    def __init__(self, A, h=None, r0: float = 0.0):
        A = torch.as_tensor(A, dtype=torch.float64)
        if A.ndim == 1:
            A = torch.diag(A)
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"A must be a square matrix or a diagonal, got shape {tuple(A.shape)}")
        self.A = 0.5 * (A + A.T)
        d = A.shape[0]
        self.h = torch.zeros(d, dtype=torch.float64) if h is None else torch.as_tensor(h, dtype=torch.float64)
        if self.h.shape != (d,):
            raise ValueError(f"h must have {d} entries, got shape {tuple(self.h.shape)}")
        self.r0 = float(r0)

    @classmethod
    def around(cls, A, c=None, b=None) -> Quadratic:
        A = torch.as_tensor(A, dtype=torch.float64)
        A = torch.diag(A) if A.ndim == 1 else A
        d = A.shape[0]
        c = torch.zeros(d, dtype=torch.float64) if c is None else torch.as_tensor(c, dtype=torch.float64)
        b = torch.zeros(d, dtype=torch.float64) if b is None else torch.as_tensor(b, dtype=torch.float64)
        return cls(A, A @ c + b, -0.5 * float(c @ A @ c))

    @staticmethod
    def combine(terms: Sequence[tuple[float, Quadratic]]) -> Quadratic:
        """The quadratic ``sum_m w_m q_m`` (exact counterpart of a :class:`WeightedSum` of quadratics)."""
        return Quadratic(sum(w * q.A for w, q in terms), sum(w * q.h for w, q in terms),
                         sum(w * q.r0 for w, q in terms))

    def __call__(self, x: Tensor) -> Tensor:
        v = x.flatten(1)
        A, h = self.A.to(v), self.h.to(v)
        return -0.5 * ((v @ A) * v).sum(1) + v @ h + self.r0

    def tilt(self, mixture, alpha: float):
        """The exact tilted mixture ``∝ p(x) exp(r(x) / alpha)``."""
        return mixture.tilt_quadratic(self.A, self.h, alpha)

    def expected(self, mixture) -> float:
        """``E[r]`` under a mixture, exactly."""
        return mixture.expected_quadratic(self.A, self.h, self.r0)


# ---------------------------------------------------------------------------------------------- digits rewards
class ClassLogProb:
    """``r(x) = log softmax(classifier(x))[target]`` (of head ``head`` for a multi-head classifier).

    The classifier runs in eval mode and in its parameters' dtype; its gradient w.r.t. the image is what DAS and
    reward guidance use. Images are not clamped (a clamp would zero the gradient outside [-1, 1]).
    """

    def __init__(self, classifier: nn.Module, target: int, head: int = 0):
        classes = list(getattr(classifier, "classes", [None]))
        if not 0 <= head < len(classes):
            raise ValueError(f"head must be in [0, {len(classes) - 1}], got {head}")
        k = classes[head]
        if k is not None and not 0 <= target < k:
            raise ValueError(f"target class must be in [0, {k - 1}], got {target}")
        self.classifier = classifier.eval()
        self.target, self.head = int(target), int(head)

    def __call__(self, x: Tensor) -> Tensor:
        dtype = next(self.classifier.parameters()).dtype
        logits = self.classifier(x.to(dtype))
        if hasattr(self.classifier, "logits_per_head"):
            logits = self.classifier.logits_per_head(logits)[self.head]
        return torch.log_softmax(logits, -1)[:, self.target].to(x.dtype)


def ink(x: Tensor) -> Tensor:
    """Mean intensity in [0, 1] for images in [-1, 1] (ink is +1 in the digits set)."""
    return ((x + 1) / 2).flatten(1).mean(1)


def redness(x: Tensor) -> Tensor:
    """Redness of RGB images ``[B, 3, H, W]`` in [-1, 1]: mean red channel minus the mean of green and blue, in
    [-2, 2] (a decoded-image reward for text-to-image pipelines)."""
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"the red reward needs RGB images [B, 3, H, W], got shape {tuple(x.shape)}")
    return (x[:, 0] - (x[:, 1] + x[:, 2]) / 2).flatten(1).mean(1)


def symmetry(x: Tensor) -> Tensor:
    """Left-right symmetry ``-mean((x - flip_W(x))^2)``: 0 for a mirror-symmetric image, down to -4."""
    return -((x - x.flip(-1)) ** 2).flatten(1).mean(1)


def heldout_digits_classifier(C: float = 0.5):
    """A held-out digits classifier for cross rewards: logistic regression (scikit-learn) on the train split's
    pixels, independent of the shipped CNN. Returns ``(log_probs, test_accuracy)`` with ``log_probs(x) -> [B, 10]``
    differentiable in torch."""
    from sklearn.linear_model import LogisticRegression

    from ..data.digits import load_digits

    x, y = load_digits("train")
    lr = LogisticRegression(max_iter=2000, C=C).fit(x.flatten(1).numpy(), y.numpy())
    w = torch.tensor(lr.coef_, dtype=torch.float32)
    b = torch.tensor(lr.intercept_, dtype=torch.float32)

    def log_probs(imgs: Tensor) -> Tensor:
        return torch.log_softmax(imgs.float().flatten(1) @ w.T + b, 1)

    xt, yt = load_digits("test")
    return log_probs, float((log_probs(xt).argmax(1) == yt).float().mean())


class Linear:
    """``r(x) = a . x`` on flattened samples (the exact tilt of a mixture is ``tilt_linear``).

    ``a`` has one coefficient per entry of a sample; a sample of another size is a ``ValueError`` naming both sizes
    (:func:`check_reward_shape` makes the same check before sampling).
    """

    def __init__(self, a):
        self.a = torch.as_tensor(a, dtype=torch.float64).flatten()
        if self.a.numel() == 0 or not torch.isfinite(self.a).all():
            raise ValueError(f"a linear reward needs one or more finite coefficients, got {self.a.tolist()}")

    @property
    def dim(self) -> int:
        """The sample size ``a`` is defined for."""
        return self.a.numel()

    def __call__(self, x: Tensor) -> Tensor:
        v = x.flatten(1)
        if v.shape[1] != self.dim:
            raise ValueError(f"linear reward has {self.dim} coefficient(s) but the samples have {v.shape[1]} entries "
                             f"(shape {tuple(x.shape[1:])}); give one coefficient per entry")
        return v @ self.a.to(x)


def reward_dim(reward) -> int | None:
    """The flattened sample size a reward's parameters fix (a :class:`Linear`'s ``a``, a :class:`Quadratic`'s ``A``,
    the terms of a :class:`WeightedSum`), or None for a reward that takes any size (``ink``, ``symmetry``, ...).

    Raises:
        ValueError: the terms of a weighted sum fix different sizes.
    """
    if isinstance(reward, WeightedSum):
        dims = {d for d in (reward_dim(r) for _, r in reward.terms) if d is not None}
        if len(dims) > 1:
            raise ValueError(f"the reward's terms are defined for different sample sizes {sorted(dims)}")
        return dims.pop() if dims else None
    if isinstance(reward, Linear):
        return reward.dim
    if isinstance(reward, Quadratic):
        return reward.A.shape[0]
    return None


def check_reward_shape(reward, sample_shape: Sequence[int]) -> None:
    """Check that a reward's parameters fit samples of ``sample_shape`` (before any sampling).

    A linear or quadratic reward needs one coefficient per entry of a sample; a class log-probability reward needs
    images with as many channels as its classifier takes.

    Raises:
        ValueError: naming the reward's size and the samples' shape.
    """
    shape = tuple(int(s) for s in sample_shape)
    size = 1
    for s in shape:
        size *= s
    dim = reward_dim(reward)
    if dim is not None and dim != size:
        raise ValueError(f"reward is defined for samples of {dim} entries, but the model's samples have shape {shape} "
                         f"({size} entries); give one coefficient per entry")
    terms = reward.terms if isinstance(reward, WeightedSum) else [(1.0, reward)]
    for _, r in terms:
        if isinstance(r, ClassLogProb):
            channels = (getattr(r.classifier, "config", None) or {}).get("in_channels")
            if len(shape) != 3 or (channels is not None and shape[0] != channels):
                raise ValueError(f"reward class:{r.target} scores images with {channels} channel(s) [C, H, W], but "
                                 f"the model's samples have shape {shape}")


def _one(spec: str, classifier: nn.Module | None) -> Callable:
    name, _, arg = spec.strip().partition(":")
    if name == "class":
        if classifier is None:
            raise ValueError("reward 'class:K' needs a classifier (the shipped digits_classifier)")
        try:
            return ClassLogProb(classifier, int(arg))
        except ValueError as e:
            raise ValueError(f"bad reward {spec!r}: {e}") from e
    if name in ("ink", "symmetry") and not arg:
        return ink if name == "ink" else symmetry
    if name == "linear" and arg:
        try:
            coefficients = [float(v) for v in arg.split(",")]
        except ValueError as e:
            raise ValueError(f"bad reward {spec!r}: linear:a1,a2,... takes numbers separated by commas") from e
        try:
            return Linear(coefficients)
        except ValueError as e:
            raise ValueError(f"bad reward {spec!r}: {e}") from e
    raise ValueError(f"unknown reward {spec!r}; use class:K, ink, symmetry, linear:a1,a2,... or a weighted sum "
                     "such as 0.5*class:3+0.5*ink")


def from_spec(spec: str, classifier: nn.Module | None = None,
              sample_shape: Sequence[int] | None = None) -> Callable:
    """Parse ``class:3``, ``ink``, ``symmetry``, ``linear:1,0`` or ``w1*spec1+w2*spec2`` into a reward; with
    ``sample_shape``, also check that it fits the model's samples (:func:`check_reward_shape`).

    Raises:
        ValueError: an unknown or malformed spec, or (``sample_shape``) a reward that does not fit the samples.
    """
    terms = []
    for part in spec.split("+"):
        w, star, rest = part.partition("*")
        if star:
            try:
                weight = float(w)
            except ValueError as e:
                raise ValueError(f"bad weight {w!r} in reward {spec!r}") from e
            if not math.isfinite(weight):
                raise ValueError(f"bad weight {w!r} in reward {spec!r}: weights must be finite")
            terms.append((weight, _one(rest, classifier)))
        else:
            terms.append((1.0, _one(part, classifier)))
    reward = terms[0][1] if len(terms) == 1 and terms[0][0] == 1.0 else WeightedSum(terms)
    if sample_shape is not None:
        try:
            check_reward_shape(reward, sample_shape)
        except ValueError as e:
            raise ValueError(f"reward {spec!r}: {e}") from e
    return reward
