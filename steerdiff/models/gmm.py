"""The analytic Gaussian mixture: an exact denoiser and the closed-form oracles every method is checked against.

``x0 ~ sum_k w_k N(mu_k, S_k)`` diffuses to ``p_sigma = sum_k w_k N(mu_k, S_k + sigma^2 I)``. With responsibilities
``r_k(x) ∝ w_k N(x; mu_k, S_k + sigma^2 I)`` (docs/methods/conventions.md, "Measuring": ground truth first):

* denoiser ``D(x, sigma) = sum_k r_k m_k``, ``m_k = mu_k + S_k (S_k + sigma^2 I)^-1 (x - mu_k)``;
* posterior covariance ``Cov[x0 | x] = sum_k r_k (C_k + m_k m_k^T) - D D^T``, ``C_k = sigma^2 S_k (S_k + sigma^2 I)^-1``
  (which equals ``sigma^2 dD/dx``, Tweedie's second-order identity);
* linear tilt ``p(x) exp(a.x / alpha)``: components ``N(mu_k + S_k a / alpha, S_k)`` with log-weights
  ``log w_k + a.mu_k / alpha + a^T S_k a / (2 alpha^2)``;
* linear-Gaussian posterior for ``y = A x + n``, ``n ~ N(0, s_n^2 I)``: Kalman update of each component, weights
  ``∝ w_k N(y; A mu_k, A S_k A^T + s_n^2 I)``.

Components may carry integer labels; a condition restricts the mixture to the matching components (``-1`` in a slot
matches anything), which is the exact conditional model (the oracle of docs/methods/guidance.md,
"Exact Gaussian-mixture test (G1-G5)", and of the composition checks in docs/methods/coind.md). All arithmetic is
float64; each covariance is eigendecomposed once so every sigma costs only elementwise work.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.denoiser import NULL


def _as_covs(covs, k: int, d: int) -> Tensor:
    c = torch.as_tensor(covs, dtype=torch.float64)
    if c.ndim == 0:
        c = c.expand(k)
    if c.shape == (k,):
        return c[:, None, None] * torch.eye(d, dtype=torch.float64)
    if c.shape == (k, d):
        return torch.diag_embed(c)
    if c.shape == (k, d, d):
        return c.clone()
    raise ValueError(f"covs must be a scalar, [K], [K, d] or [K, d, d] with K={k}, d={d}; got shape {tuple(c.shape)}")


class GaussianMixture:
    """Exact denoiser ``D(x, sigma, cond)`` of a Gaussian mixture, with its closed-form oracles.

    Args:
        weights: ``[K]`` non-negative, normalised here (must sum to a positive number).
        means: ``[K, d]``.
        covs: ``[K, d, d]`` symmetric positive definite, or ``[K, d]`` diagonals, ``[K]`` or a scalar variance.
        labels: optional integer ``[K]`` or ``[K, m]`` labels of the components, for conditioning.
    """

    sigma_range = (0.0, math.inf)
    """Every level, ``inf`` included (see :meth:`__call__`): samplers may start this denoiser at pure noise."""

    def __init__(self, weights, means, covs, labels=None):
        w = torch.as_tensor(weights, dtype=torch.float64).flatten()
        mu = torch.as_tensor(means, dtype=torch.float64)
        if mu.ndim != 2 or mu.shape[0] != w.numel():
            raise ValueError(f"means must be [K, d] with K={w.numel()} (len(weights)), got shape {tuple(mu.shape)}")
        if not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise ValueError("weights must be finite, non-negative and sum to a positive number")
        if not torch.isfinite(mu).all():
            raise ValueError("means must be finite")
        k, d = mu.shape
        cov = _as_covs(covs, k, d)
        if not torch.isfinite(cov).all() or not torch.allclose(cov, cov.mT, atol=1e-10, rtol=1e-8):
            raise ValueError("covs must be finite and symmetric")
        cov = 0.5 * (cov + cov.mT)
        evals, evecs = torch.linalg.eigh(cov)
        bad = (evals.min(-1).values <= 1e-12 * evals.max(-1).values.clamp_min(1.0)).nonzero().flatten()
        if bad.numel():
            k0 = int(bad[0])
            raise ValueError(f"covs[{k0}] is not positive definite (smallest eigenvalue {evals[k0].min():.3g})")
        self.weights = w / w.sum()
        self.means = mu
        self.covs = cov
        self._evals, self._evecs = evals, evecs  # S_k = U_k diag(l_k) U_k^T
        self.labels = None
        if labels is not None:
            lab = torch.as_tensor(labels, dtype=torch.int64)
            lab = lab[:, None] if lab.ndim == 1 else lab
            if lab.ndim != 2 or lab.shape[0] != k or (lab < 0).any():
                raise ValueError(f"labels must be non-negative integers [K] or [K, m] with K={k}")
            self.labels = lab
        self.sample_shape = (d,)

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    @property
    def n_components(self) -> int:
        return self.means.shape[0]

    # --- internals -------------------------------------------------------------------------------------------
    def _on(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """``(log weights, means, evals, evecs, labels)`` on ``device`` (float64; copied once per device).

        The mixture computes on the device of the ``x`` it is given, so that a sampler on an accelerator hands it no
        tensor to copy back to the host (a device synchronisation) at each call; on the CPU these are the mixture's
        own tensors (the same arithmetic as ever). MPS has no float64: there the work stays on the CPU.
        """
        if device.type in ("cpu", "mps"):
            return self.weights.log(), self.means, self._evals, self._evecs, self.labels
        cache = self.__dict__.setdefault("_device_copies", {})
        if device not in cache:
            cache[device] = tuple(None if t is None else t.to(device) for t in
                                  (self.weights.log(), self.means, self._evals, self._evecs, self.labels))
        return cache[device]

    def _cond_mask(self, cond: Tensor | None, b: int, device: torch.device | None = None) -> Tensor | None:
        """``[B, K]`` boolean mask of the components each sample's condition allows (None = all), on ``device``.

        A condition on the CPU is checked here (a host read, which costs no device synchronisation there): a row
        matching no component raises. A condition on an accelerator is not read back (that would synchronise at
        every denoiser call inside a sampling loop): a row matching no component gets the responsibilities
        ``softmax(-inf, ..., -inf) = NaN``, so its output is non-finite and the sampler's finite check reports it.
        """
        if cond is None:
            return None
        if self.labels is None:
            raise ValueError("cond given but this mixture has no component labels")
        c = torch.as_tensor(cond)
        device = c.device if device is None else device
        if c.device.type != "cpu" and c.device != device:
            c = c.to(device)
        c = c.to(torch.int64)
        c = c[:, None] if c.ndim == 1 else c
        if c.shape != (b, self.labels.shape[1]):
            raise ValueError(f"cond must be [B] or [B, m] with B={b}, m={self.labels.shape[1]}; got {tuple(c.shape)}")
        labels = self.labels if c.device.type == "cpu" else self._on(c.device)[4]
        mask = ((labels[None] == c[:, None]) | (c[:, None] == NULL)).all(-1)
        if c.device.type == "cpu" and not mask.any(1).all():
            i = int((~mask.any(1)).nonzero()[0])
            raise ValueError(f"cond[{i}]={c[i].tolist()} matches no component (labels: {self.labels.tolist()})")
        return mask if mask.device == device else mask.to(device)

    def _terms(self, x: Tensor, sigma: Tensor, cond: Tensor | None):
        """Log-responsibilities ``[B, K]``, eigen-coordinates ``z = U^T (x - mu)`` and variances ``l + sigma^2``,
        float64 on ``x``'s device (the CPU for an MPS ``x``)."""
        x = torch.as_tensor(x)
        device = torch.device("cpu") if x.device.type == "mps" else x.device
        x = x.to(device, torch.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must be [B, {self.dim}], got {tuple(x.shape)}")
        log_w, means, evals, evecs, _ = self._on(device)
        s2 = torch.as_tensor(sigma, dtype=torch.float64).to(device).expand(x.shape[0]) ** 2
        z = torch.einsum("kde,bkd->bke", evecs, x[:, None] - means[None])
        var = evals[None] + s2[:, None, None]  # [B, K, d]
        log_n = -0.5 * ((z**2 / var).sum(-1) + var.log().sum(-1) + self.dim * math.log(2 * math.pi))
        logits = log_w[None] + log_n
        # The limit sigma -> inf with x = the unit noise: responsibilities = prior weights. A select, not a test of
        # the levels (which would read them back from the device at every call); where no level is inf it
        # returns the logits unchanged.
        logits = torch.where(torch.isinf(s2)[:, None], log_w[None].expand_as(logits), logits)
        mask = self._cond_mask(cond, x.shape[0], device)
        if mask is not None:
            logits = logits.masked_fill(~mask, -math.inf)
        return logits, z, var, s2

    # --- the denoiser and its moments ------------------------------------------------------------------------
    def __call__(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        """Exact ``E[x0 | x_sigma = x]`` (any sigma >= 0; sigma = 0 returns x).

        At ``sigma = inf`` ``x`` is the unit noise (the limit of ``x / sigma``, as the samplers hand it over) and the
        answer is the limit, the prior mean ``sum_k w_k mu_k`` (of the components ``cond`` allows): the
        responsibilities tend to the prior weights and each ``m_k`` to ``mu_k``.
        """
        logits, z, var, _ = self._terms(x, sigma, cond)
        r = torch.softmax(logits, -1)
        m = self._component_means(z, var)
        return torch.einsum("bk,bkd->bd", r, m).to(device=torch.as_tensor(x).device, dtype=torch.as_tensor(x).dtype)

    def _component_means(self, z: Tensor, var: Tensor) -> Tensor:
        # m_k = mu_k + U (l / (l + s^2)) z
        _, means, evals, evecs, _ = self._on(z.device)
        return means[None] + torch.einsum("kde,bke->bkd", evecs, evals[None] / var * z)

    def posterior_cov(self, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
        """Exact ``Cov[x0 | x_sigma = x]``, ``[B, d, d]`` float64."""
        logits, z, var, s2 = self._terms(x, sigma, cond)
        r = torch.softmax(logits, -1)
        m = self._component_means(z, var)
        _, _, evals, evecs, _ = self._on(z.device)
        shrink = evals[None] * s2[:, None, None] / var  # eigenvalues of C_k
        shrink = torch.where(torch.isinf(s2)[:, None, None], evals[None], shrink)  # C_k -> S_k at sigma = inf
        c_k = torch.einsum("kde,bke,kfe->bkdf", evecs, shrink, evecs)
        second = torch.einsum("bk,bkdf->bdf", r, c_k + m[..., :, None] * m[..., None, :])
        mean = torch.einsum("bk,bkd->bd", r, m)
        cov = second - mean[:, :, None] * mean[:, None, :]
        return 0.5 * (cov + cov.mT)

    def log_prob(self, x: Tensor, sigma: float | Tensor = 0.0, cond: Tensor | None = None) -> Tensor:
        """``log p_sigma(x)`` ``[B]`` (of the conditional mixture when ``cond`` is given)."""
        logits, _, _, s2 = self._terms(x, sigma, cond)
        if cond is not None:  # renormalise the prior weights over the allowed components
            log_w = self._on(logits.device)[0]
            w = log_w[None].masked_fill(~self._cond_mask(cond, logits.shape[0], logits.device), -math.inf)
            out = torch.logsumexp(logits, -1) - torch.logsumexp(w, -1)
        else:
            out = torch.logsumexp(logits, -1)
        return out.masked_fill(torch.isinf(s2), -math.inf)  # an infinitely wide density vanishes everywhere

    def responsibilities(self, x: Tensor, sigma: float | Tensor = 0.0, cond: Tensor | None = None) -> Tensor:
        """Posterior component probabilities ``[B, K]``."""
        logits, *_ = self._terms(x, sigma, cond)
        return torch.softmax(logits, -1)

    # --- sampling and derived mixtures -----------------------------------------------------------------------
    def sample(self, n: int, generator: torch.Generator | None = None, return_components: bool = False):
        """``n`` exact samples ``[n, d]`` (float64), and their component indices if asked."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        z = torch.randn(n, self.dim, dtype=torch.float64, generator=generator)
        chol = self._evecs * self._evals.sqrt()[:, None, :]  # U diag(sqrt l): a square root of S_k
        x = self.means[comp] + torch.einsum("nde,ne->nd", chol[comp], z)
        return (x, comp) if return_components else x

    def restrict(self, cond: Tensor) -> GaussianMixture:
        """The exact conditional mixture for one condition ``[m]`` (or a scalar class)."""
        mask = self._cond_mask(torch.as_tensor(cond).cpu().reshape(1, -1), 1)[0]
        return GaussianMixture(self.weights[mask], self.means[mask], self.covs[mask], self.labels[mask])

    def tilt_linear(self, a: Tensor, alpha: float) -> GaussianMixture:
        """The exact mixture ``∝ p(x) exp(a.x / alpha)``."""
        if not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        a = torch.as_tensor(a, dtype=torch.float64).flatten()
        if a.numel() != self.dim:
            raise ValueError(f"a must have {self.dim} entries, got {a.numel()}")
        sa = self.covs @ a  # [K, d]
        logw = self.weights.log() + self.means @ a / alpha + (sa @ a) / (2 * alpha**2)
        return GaussianMixture(torch.softmax(logw, 0), self.means + sa / alpha, self.covs, self.labels)

    # --- quadratic rewards r(x) = -1/2 x^T A x + h^T x + r0 (exact tilted targets of DAS's P1-P4; docs/methods/das.md)
    def _quadratic_args(self, A, h, alpha: float | None = None) -> tuple[Tensor, Tensor]:
        if alpha is not None and not alpha > 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        d = self.dim
        A = torch.as_tensor(A, dtype=torch.float64)
        A = A * torch.eye(d, dtype=torch.float64) if A.ndim == 0 else A
        A = torch.diag(A) if A.ndim == 1 else A
        if A.shape != (d, d) or not torch.isfinite(A).all() or not torch.allclose(A, A.T, atol=1e-10, rtol=1e-8):
            raise ValueError(f"A must be a finite symmetric [{d}, {d}] matrix (or a [{d}] diagonal, or a scalar)")
        h = torch.zeros(d, dtype=torch.float64) if h is None else torch.as_tensor(h, dtype=torch.float64).flatten()
        if h.numel() != d or not torch.isfinite(h).all():
            raise ValueError(f"h must have {d} finite entries, got {h.numel()}")
        return 0.5 * (A + A.T), h

    def _quadratic_tilt_terms(self, A, h, alpha: float):
        """Per component: tilted covariances, means and ``log Z_k`` (without ``r0``), float64."""
        A, h = self._quadratic_args(A, h, alpha)
        prec = torch.linalg.inv(self.covs)  # [K, d, d]
        new_prec = prec + A / alpha
        chol, info = torch.linalg.cholesky_ex(0.5 * (new_prec + new_prec.mT))
        if (info != 0).any():
            k = int((info != 0).nonzero()[0])
            raise ValueError(f"the tilt is not normalisable: S_{k}^-1 + A/alpha is not positive definite")
        eye = torch.eye(self.dim, dtype=torch.float64).expand_as(prec)
        cov = torch.cholesky_solve(eye, chol)
        cov = 0.5 * (cov + cov.mT)
        eta = (prec @ self.means[..., None])[..., 0] + h / alpha  # natural parameter S~^-1 m~
        mean = (cov @ eta[..., None])[..., 0]
        logdet_new = -2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # log det S~
        logdet_old = torch.linalg.slogdet(self.covs)[1]
        log_z = 0.5 * (logdet_new - logdet_old) + 0.5 * (mean * eta).sum(-1) - 0.5 * (
            self.means * (prec @ self.means[..., None])[..., 0]).sum(-1)
        return cov, mean, log_z

    def tilt_quadratic(self, A, h=None, alpha: float = 1.0) -> GaussianMixture:
        """The exact mixture ``∝ p(x) exp(r(x) / alpha)`` for ``r(x) = -1/2 x^T A x + h^T x (+ r0)``.

        Per component ``S~ = (S^-1 + A/alpha)^-1``, ``m~ = S~ (S^-1 mu + h/alpha)``, weight ``∝ w_k Z_k`` with
        ``log Z_k = 1/2 log(det S~ / det S) + 1/2 m~^T S~^-1 m~ - 1/2 mu^T S^-1 mu`` (completing the square in each
        component; the reward-tilted target ``p exp(r / alpha)`` of DAS, Kim et al., ICLR 2025; docs/methods/das.md,
        "Validation problems and pass criteria"). ``A`` may be a ``[d, d]`` symmetric matrix, a ``[d]`` diagonal or a
        scalar; it need not be PSD as long as every ``S_k^-1 + A/alpha`` is positive definite. ``A = 0`` is
        :meth:`tilt_linear` with ``a = h``.
        """
        cov, mean, log_z = self._quadratic_tilt_terms(A, h, alpha)
        return GaussianMixture(torch.softmax(self.weights.log() + log_z, 0), mean, cov, self.labels)

    def quadratic_log_normalizer(self, A, h=None, alpha: float = 1.0, r0: float = 0.0) -> float:
        """``log E_p[exp(r(x) / alpha)]`` for ``r(x) = -1/2 x^T A x + h^T x + r0`` (the tilt's log-evidence)."""
        _, _, log_z = self._quadratic_tilt_terms(A, h, alpha)
        return float(torch.logsumexp(self.weights.log() + log_z, 0)) + r0 / alpha

    def expected_quadratic(self, A, h=None, r0: float = 0.0) -> float:
        """``E_p[-1/2 x^T A x + h^T x + r0]`` under this mixture, exactly."""
        A, h = self._quadratic_args(A, h)
        per = (-0.5 * (A[None] * self.covs).sum((-2, -1)) - 0.5 * (self.means * (self.means @ A)).sum(-1)
               + self.means @ h + r0)
        return float(self.weights @ per)

    def posterior_linear(self, A: Tensor, y: Tensor, noise_std: float) -> GaussianMixture:
        """The exact posterior ``p(x | y)`` for ``y = A x + n``, ``n ~ N(0, noise_std^2 I)``."""
        A = torch.as_tensor(A, dtype=torch.float64)
        y = torch.as_tensor(y, dtype=torch.float64).flatten()
        if A.ndim != 2 or A.shape[1] != self.dim:
            raise ValueError(f"A must be [p, {self.dim}], got {tuple(A.shape)}")
        if y.numel() != A.shape[0]:
            raise ValueError(f"y must have {A.shape[0]} entries (rows of A), got {y.numel()}")
        if not noise_std >= 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        sat = self.covs @ A.T  # [K, d, p]
        gram = A @ sat + noise_std**2 * torch.eye(A.shape[0], dtype=torch.float64)  # [K, p, p]
        chol, info = torch.linalg.cholesky_ex(gram)
        if (info != 0).any():
            raise ValueError("A S_k A^T + noise_std^2 I is singular; use noise_std > 0")
        resid = y[None] - self.means @ A.T  # [K, p]
        sol = torch.cholesky_solve(resid[..., None], chol)[..., 0]
        gain_t = torch.cholesky_solve(sat.mT, chol)  # (A S A^T + s^2 I)^-1 A S = K^T
        means = self.means + torch.einsum("kdp,kp->kd", sat, sol)
        covs = self.covs - sat @ gain_t
        logdet = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        log_n = -0.5 * ((resid * sol).sum(-1) + logdet + y.numel() * math.log(2 * math.pi))
        return GaussianMixture(torch.softmax(self.weights.log() + log_n, 0), means, 0.5 * (covs + covs.mT), self.labels)


def _ring(k: int, radius: float, seed: int) -> GaussianMixture:
    g = torch.Generator().manual_seed(seed)
    ang = torch.arange(k, dtype=torch.float64) * 2 * math.pi / k
    means = radius * torch.stack([ang.cos(), ang.sin()], 1)
    w = 1.0 + torch.rand(k, generator=g, dtype=torch.float64) * 2  # unequal weights, 1..3
    # Anisotropic covariances: radial std 0.15..0.35, tangential 0.1.
    rad = 0.15 + 0.2 * torch.rand(k, generator=g, dtype=torch.float64)
    rot = torch.stack([torch.stack([ang.cos(), -ang.sin()], -1), torch.stack([ang.sin(), ang.cos()], -1)], -2)
    covs = rot @ torch.diag_embed(torch.stack([rad**2, torch.full_like(rad, 0.01)], -1)) @ rot.mT
    return GaussianMixture(w, means, covs, labels=torch.arange(k))


def _random_mixture(k: int, d: int, seed: int, spread: float = 2.0) -> GaussianMixture:
    g = torch.Generator().manual_seed(seed)
    means = spread * torch.randn(k, d, generator=g, dtype=torch.float64)
    w = 1.0 + torch.rand(k, generator=g, dtype=torch.float64) * 2
    q = torch.linalg.qr(torch.randn(k, d, d, generator=g, dtype=torch.float64)).Q
    ev = 0.05 + 0.25 * torch.rand(k, d, generator=g, dtype=torch.float64)
    return GaussianMixture(w, means, q @ torch.diag_embed(ev) @ q.mT, labels=torch.arange(k))


BUILTIN_MIXTURES = {
    "gmm1d": lambda: GaussianMixture([0.3, 0.7], [[-2.0], [1.5]], [0.25, 0.09], labels=[0, 1]),
    "gmm2d": lambda: _ring(8, 3.0, seed=0),
    "gmm16d": lambda: _random_mixture(6, 16, seed=0),
}


def builtin_mixture(name: str) -> GaussianMixture:
    """A named built-in mixture: ``gmm1d``, ``gmm2d`` (8 anisotropic modes on a ring), ``gmm16d`` (6 modes)."""
    if name not in BUILTIN_MIXTURES:
        raise ValueError(f"unknown mixture {name!r}; built-in mixtures: {sorted(BUILTIN_MIXTURES)}")
    return BUILTIN_MIXTURES[name]()
