"""The optimal Gaussian reverse kernel of OCM (Ou et al., ICLR 2025: the moment-matched kernel with a diagonal
posterior covariance) and its baselines, on one code path (docs/methods/ocm.md, "Reverse kernel" and "Baselines").

One reverse step from ``t`` to ``s < t`` with the denoiser's ``D`` and a diagonal posterior covariance ``c``::

    DDPM-type:  r = s^2/t^2;  mu = D + r (x - D);  lam2 = s^2 (t^2 - s^2)/t^2;  a = 1 - r
    DDIM-type:  lam2 = eta^2 s^2 (t^2 - s^2)/t^2;  k = sqrt(s^2 - lam2)/t;  mu = D + k (x - D);  a = 1 - k
    Sigma = lam2 + a^2 c;   x_s = mu + sqrt(Sigma) z;   last step (s = 0): x_0 = D, no noise.

Every method differs only in ``c``: OCM (a learned head, :mod:`~steerdiff.models.ocm_heads`), the oracle
``diag Cov[x0|x]`` of a Gaussian mixture, DDPM beta-tilde / DDIM (``c = 0``), DDPM beta (``c = t^2/(1+t^2)``, the
exact covariance of ``N(0, I)`` data, which gives ``Sigma = (1+s^2)(t^2-s^2)/(1+t^2)``), Analytic-DPM (isotropic,
state-free ``c_t = E||x0 - D(x_t)||^2 / d``) and a Monte Carlo Jacobian diagonal.

``c`` is clamped to ``[0, c_max]`` at use ("Clamps and clips"); negative and non-finite predictions are counted and
reported with one ``RuntimeWarning`` per run, never silently (docs/methods/conventions.md, "Errors"). The prior is
the sampler's ``noise * sigmas[0]`` (the VE prior; the VP prior ``N(0, (1 + sigma_K^2) I)`` of the official code
differs from it by a relative ``1/sigma_K^2``, 4e-5 on the VP-linear grid).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.calls import emit, host_copy, sigma_batch
from ..core.denoiser import NFECounter, append_dims, host_level
from ..core.noise import GeneratorLike, SampleNoise, make_generators
from ..core.registry import register_sampler
from ..core.sampling import check_sample_inputs, denoise_checked, step_range
from ..core.sigmas import check_sigmas
from ..models.gmm import GaussianMixture
from ..models.ocm_heads import OCMHead
from .target import hutchinson_diag

KINDS = ("ddpm", "ddim")
BASELINES = ("ddpm-beta-tilde", "ddpm-beta", "ddim")
OCM = ("ocm-ddpm", "ocm-ddim")
ANALYTIC = ("analytic-ddpm", "analytic-ddim")
CovFn = Callable[[Tensor, Tensor, "Tensor | None", Tensor], Tensor]


def kernel_coefficients(t: float, s: float, kind: str, eta: float = 0.0) -> tuple[float, float, float]:
    """``(k, lam2, a)`` of the step ``t -> s`` (docs/methods/ocm.md, "Reverse kernel"): ``mu = D + k (x - D)``,
    ``Sigma = lam2 + a^2 c``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not (0 <= s < t) or not math.isfinite(t):
        raise ValueError(f"need 0 <= s < t < inf, got t={t}, s={s}")
    if kind == "ddpm":
        k = s**2 / t**2
        lam2 = s**2 * (t**2 - s**2) / t**2
    else:
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"eta must lie in [0, 1], got {eta}")
        lam2 = eta**2 * s**2 * (t**2 - s**2) / t**2
        k = math.sqrt(max(0.0, s**2 - lam2)) / t
    return k, lam2, 1.0 - k


def reverse_variance(c: Tensor | float, t: float, s: float, kind: str, eta: float = 0.0) -> Tensor | float:
    """``Sigma = lam2 + a^2 c`` of the step ``t -> s`` (EDM units; docs/methods/ocm.md, "Reverse kernel")."""
    _, lam2, a = kernel_coefficients(t, s, kind, eta)
    return lam2 + a**2 * c


def clamp_covariance_counted(c: Tensor, c_max: float = math.inf) -> tuple[Tensor, Tensor]:
    """Clamp ``c`` to ``[0, c_max]``; non-finite entries become ``c_max`` (or 0 if ``c_max`` is inf).

    Returns ``(c, counts)`` with ``counts`` an int64 tensor ``[2]`` on ``c``'s device: the negative and the
    non-finite entries. Nothing is read back to the host (a sampling loop adds the counts up on the device and
    reads them once, after its last step). Where every entry is finite the select returns ``c`` unchanged.
    """
    finite = torch.isfinite(c)
    counts = torch.stack([(c < 0).sum(), (~finite).sum()])
    c = torch.where(finite, c, torch.full_like(c, c_max if math.isfinite(c_max) else 0.0))
    return c.clamp(0.0, c_max), counts


def clamp_covariance(c: Tensor, c_max: float = math.inf) -> tuple[Tensor, int, int]:
    """Clamp ``c`` to ``[0, c_max]``; non-finite entries become ``c_max`` (or 0 if ``c_max`` is inf).

    Returns ``(c, n_negative, n_nonfinite)`` (one host read of the counts; :func:`clamp_covariance_counted` keeps
    them on the device).
    """
    c, counts = clamp_covariance_counted(c, c_max)
    n_negative, n_nonfinite = host_copy(counts).tolist()
    return c, n_negative, n_nonfinite


# ------------------------------------------------------------------------------------------ covariance sources


class CovarianceSource:
    """Anything that gives ``c(x, sigma) ~= diag Cov[x0 | x]`` inside a sampling run.

    ``bind(denoiser)`` is a context manager yielding ``f(x, sigma [B], cond, denoised) -> c`` (raw, unclamped).
    ``c_max`` bounds ``c`` at use; ``data_range`` (or None) is where the samplers clip ``D`` by default.
    """

    name = "covariance"
    c_max: float = math.inf
    data_range: tuple[float, float] | None = None
    last_var_max: float | None = None  # default last-step variance bound (images; see gaussian_loop)
    extra_vjps_per_step: int = 0
    always_zero: bool = False  # c = 0 at every state, known on the host (a deterministic DDIM step draws no noise)

    @contextlib.contextmanager
    def bind(self, denoiser) -> Iterator[CovFn]:
        yield self.covariance

    def covariance(self, x: Tensor, sigma: Tensor, cond: Tensor | None, denoised: Tensor) -> Tensor:
        raise NotImplementedError


class FixedCovariance(CovarianceSource):
    """State-free baselines: ``zero`` (``c = 0``: DDPM beta-tilde, DDIM) and ``beta`` (``c = t^2/(1+t^2)``)."""

    def __init__(self, kind: str = "zero", c_max: float = math.inf):
        if kind not in ("zero", "beta"):
            raise ValueError(f"kind must be 'zero' or 'beta', got {kind!r}")
        self.kind, self.name, self.c_max = kind, kind, c_max
        self.always_zero = kind == "zero"

    def covariance(self, x, sigma, cond, denoised):
        if self.kind == "zero":
            return torch.zeros_like(x)
        s2 = append_dims(sigma.to(x.dtype), x.ndim) ** 2
        return (s2 / (1 + s2)).expand_as(x).clone()


class AnalyticDPM(CovarianceSource):
    """Analytic-DPM (Bao et al., ICLR 2022): isotropic ``c_t = E||x0 - D(x0 + t eps)||^2 / d`` per noise level.

    This equals ``t^2 (1 - Gamma_t)`` with ``Gamma_t = E||eps_hat||^2 / d``; fit it once with :meth:`fit` on the
    sigmas you sample with.
    """

    name = "analytic"

    def __init__(self, table: dict[float, float], c_max: float = math.inf):
        if not table:
            raise ValueError("table must map at least one sigma to a variance")
        self.table = {float(k): float(v) for k, v in table.items()}
        self.c_max = c_max

    @classmethod
    @torch.no_grad()
    def fit(cls, denoiser, data, sigmas, n: int = 2000, labels: Tensor | None = None, c_max: float = math.inf,
            seed: int = 0, batch_size: int = 1000) -> AnalyticDPM:
        """Monte Carlo over ``n`` data points per sigma (a tensor ``[N, *shape]`` or a ``.sample(n, generator)``)."""
        g = torch.Generator().manual_seed(seed)
        sig = [float(s) for s in torch.as_tensor(sigmas).flatten() if float(s) > 0]
        if isinstance(data, Tensor):
            idx = torch.randint(0, data.shape[0], (n,), generator=g)
            x0 = data[idx].float()
            lab = None if labels is None else labels[idx]
        else:
            x0, lab = data.sample(n, generator=g).float(), None
        table = {}
        for s in sig:
            err = 0.0
            for i in range(0, n, batch_size):
                xb = x0[i : i + batch_size]
                xt = xb + s * torch.randn(xb.shape, generator=g)
                d = denoiser(xt, torch.full((xb.shape[0],), s), None if lab is None else lab[i : i + batch_size])
                err += float((d.double() - xb.double()).pow(2).sum())
            table[s] = err / x0[0].numel() / n
        return cls(table, c_max)

    def covariance(self, x, sigma, cond, denoised):
        s = host_level(sigma)  # the samplers' level, known on the host (no device read)
        s = float(sigma[0]) if s is None else s
        key = min(self.table, key=lambda k: abs(k - s))
        if abs(key - s) > 1e-6 * max(1.0, s):
            raise ValueError(f"AnalyticDPM was fitted at sigmas {sorted(self.table)[:5]}...; no entry for sigma={s:g}"
                             " (fit it on the schedule you sample with)")
        return torch.full_like(x, self.table[key])


def mixture_diag_cov(mixture: GaussianMixture, x: Tensor, sigma: Tensor, cond: Tensor | None = None) -> Tensor:
    """Exact ``diag Cov[x0 | x_sigma = x]`` ``[B, d]`` float64 of a mixture (the oracle), without the ``[B, d, d]``
    matrix: ``sum_k r_k (diag C_k + m_k^2) - D^2`` with ``diag C_k = (U_k^2) (l_k sigma^2 / (l_k + sigma^2))``.

    Uses the mixture's eigen-decomposition (``GaussianMixture._terms``); tested against ``posterior_cov``.
    """
    logits, z, var, s2 = mixture._terms(x, sigma, cond)
    r = torch.softmax(logits, -1)
    m = mixture._component_means(z, var)
    _, _, evals, evecs, _ = mixture._on(z.device)
    shrink = evals[None] * s2[:, None, None] / var  # [B, K, d] eigenvalues of C_k
    diag_c = torch.einsum("kde,bke->bkd", evecs**2, shrink)
    mean = torch.einsum("bk,bkd->bd", r, m)
    return torch.einsum("bk,bkd->bd", r, diag_c + m**2) - mean**2


class OracleCovariance(CovarianceSource):
    """Exact ``diag Cov[x0 | x_sigma]`` of a :class:`~steerdiff.models.GaussianMixture` (the oracle baseline)."""

    name = "oracle"

    def __init__(self, mixture: GaussianMixture, c_max: float = math.inf):
        self.mixture, self.c_max = mixture, c_max

    def covariance(self, x, sigma, cond, denoised):
        return mixture_diag_cov(self.mixture, x, sigma, cond).to(device=x.device, dtype=x.dtype)


class MonteCarloCovariance(CovarianceSource):
    """``c = t^2 mean_m v_m * (J^T v_m)`` with ``n_probes`` Rademacher probes at every step (the official code's
    head-free ``epshesest`` uses 100 probes). Costs one extra forward and ``n_probes`` VJPs per step."""

    name = "mc"

    def __init__(self, n_probes: int = 32, c_max: float = math.inf, seed: int = 0,
                 data_range: tuple[float, float] | None = None):
        self.n_probes, self.c_max, self.data_range = n_probes, c_max, data_range
        self.extra_vjps_per_step = n_probes
        self.generator = torch.Generator().manual_seed(seed)

    @contextlib.contextmanager
    def bind(self, denoiser):
        def cov(x, sigma, cond, denoised):
            xg = x.detach().requires_grad_(True)
            with torch.enable_grad():
                d = denoiser(xg, sigma, cond)
                diag_j = hutchinson_diag(d, xg, self.n_probes, self.generator)
            return append_dims(sigma.to(x.dtype), x.ndim) ** 2 * diag_j.to(x.dtype)

        yield cov


class HeadCovariance(CovarianceSource):
    """A learned :class:`~steerdiff.models.ocm_heads.OCMHead` (OCM). A trunk head reads the features of
    the denoiser's own forward pass (no extra network call); a head loaded with a fingerprint is checked against
    the denoiser it is bound to."""

    name = "ocm"

    def __init__(self, head: OCMHead, c_max: float | None = None):
        self.head = head
        self.c_max = head.c_max if c_max is None else c_max
        self.data_range = head.data_range
        self.last_var_max = getattr(head, "last_step_var_max", None)

    @contextlib.contextmanager
    def bind(self, denoiser):
        stored = getattr(self.head, "denoiser_fingerprint", None)
        if stored is not None and isinstance(denoiser, nn.Module | GaussianMixture):
            from ..io import CheckpointError
            from .store import denoiser_fingerprint

            if denoiser_fingerprint(denoiser) != stored:
                raise CheckpointError(
                    "covariance: this head was trained for a different denoiser (stored fingerprint "
                    f"{stored[:12]}...); retrain it with steerdiff.covariance.train_ocm for this denoiser"
                )
        self.head.eval()
        with self.head.capture(denoiser) as store:

            def cov(x, sigma, cond, denoised):
                with torch.no_grad():
                    return self.head.covariance(x, sigma, store["features"])

            yield cov


class FunctionCovariance(CovarianceSource):
    """A user's covariance function ``c(x, sigma [B], cond) -> diag Cov[x0 | x]`` (same shape as ``x``), e.g. a
    closed form or another model's estimate; checked for its shape at every call."""

    name = "function"

    def __init__(self, fn: Callable, c_max: float = math.inf):
        self.fn, self.c_max = fn, c_max

    def covariance(self, x, sigma, cond, denoised):
        c = self.fn(x, sigma, cond)
        if not isinstance(c, Tensor) or c.shape != x.shape:
            got = tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__
            raise ValueError(f"covariance function must return diag Cov[x0 | x] of x's shape {tuple(x.shape)}, "
                             f"got {got}")
        return c.to(x.dtype)


def as_covariance(covariance) -> CovarianceSource:
    """Normalise the ``covariance=`` argument: a source, an ``OCMHead``, a ``GaussianMixture`` (oracle), a function
    ``c(x, sigma, cond)`` (:class:`FunctionCovariance`), or one of the names ``"zero"`` / ``"beta-tilde"`` (c = 0)
    and ``"beta"``."""
    if isinstance(covariance, CovarianceSource):
        return covariance
    if isinstance(covariance, OCMHead):
        return HeadCovariance(covariance)
    if isinstance(covariance, GaussianMixture):
        return OracleCovariance(covariance)
    if isinstance(covariance, str) and covariance in ("zero", "beta-tilde", "beta"):
        return FixedCovariance("beta" if covariance == "beta" else "zero")
    if callable(covariance) and not isinstance(covariance, (str, nn.Module)):
        return FunctionCovariance(covariance)
    raise TypeError(
        "covariance must be a trained head (steerdiff.covariance.load_head / train_ocm), a GaussianMixture (oracle), "
        f"a CovarianceSource, a function c(x, sigma, cond), or 'zero' / 'beta-tilde' / 'beta'; got "
        f"{type(covariance).__name__}"
    )


def method_spec(method: str, covariance=None, analytic: AnalyticDPM | None = None):
    """``(kind, covariance)`` of a method name of the baselines table; ``covariance`` is the OCM source (an oracle
    mixture or a head), ``analytic`` a fitted :class:`AnalyticDPM`."""
    table = {"ddpm-beta-tilde": ("ddpm", "zero"), "ddpm-beta": ("ddpm", "beta"), "ddim": ("ddim", "zero"),
             "analytic-ddpm": ("ddpm", analytic), "analytic-ddim": ("ddim", analytic),
             "ocm-ddpm": ("ddpm", covariance), "ocm-ddim": ("ddim", covariance)}
    if method not in table:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(table)}")
    kind, cov = table[method]
    if cov is None:
        raise ValueError(f"method {method!r} needs its covariance (an OCM head/oracle, or a fitted AnalyticDPM)")
    return kind, cov


# ------------------------------------------------------------------------------------------------- sampling


@dataclass
class GaussianSampleResult:
    """Samples and what a user needs to judge the run: NFE per sample, clamp counts (docs/methods/conventions.md,
    "NFE accounting")."""

    samples: Tensor
    nfe: float
    n_negative: int = 0
    n_nonfinite: int = 0
    extra_vjps: int = 0

    @property
    def clamped(self) -> int:
        """Entries of ``c`` that were negative or non-finite and were clamped."""
        return self.n_negative + self.n_nonfinite


def refuse_inf_start(sigmas: list[float]) -> None:
    """The OCM kernels need a finite first level: their covariance (a head, the oracle, a baseline) and the kernel
    coefficients are defined on finite VP levels, and no covariance source has a limit at ``sigma = inf``."""
    if sigmas and math.isinf(sigmas[0]):
        raise ValueError("sigmas[0] = inf (a flow schedule's pure-noise start), but the ocm-* Gaussian kernels need "
                         "a finite first level (their covariance sources are defined on finite VP levels): use "
                         "sd.sigmas.vp_linear(steps) or drop the first level (sigmas[1:])")


def gaussian_loop(
    model: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigmas: list[float], cov_fn: CovFn, *, kind: str,
    eta: float = 0.0, cond: Tensor | None = None, noise: SampleNoise | None = None, c_max: float = math.inf,
    clip_denoised: tuple[float, float] | None = None, callback=None, progress: bool = False,
    last_var_max: float | None = None, c_zero: bool = False,
) -> tuple[Tensor, int, int]:
    """The reverse-kernel loop (docs/methods/ocm.md, "Reverse kernel"); ``model(x, sigma_batch, step)`` is the counted
    denoiser. Returns ``(x0, n_negative, n_nonfinite)``.

    ``last_var_max`` bounds ``Sigma`` of the step that lands on the smallest nonzero sigma (the official code's
    ``clip_sigma_idx = 1``; "Clamps and clips" there; images only): with ``(clip_pixel * bin * sqrt(pi/2))^2`` the
    mean absolute noise left for the final deterministic step is at most ``clip_pixel`` quantisation bins.
    ``c_zero``: the covariance is zero at every state (:attr:`CovarianceSource.always_zero`), so a step with
    ``lam2 = 0`` draws no noise (see :func:`gaussian_step`).

    No host read inside the loop: the clamp counts add up on the device and are read once, after the last step
    (with :func:`~steerdiff.core.calls.host_copy`, the one wait at the end of a run on an accelerator).
    """
    refuse_inf_start(sigmas)
    noise = noise or SampleNoise(None)
    counts = None
    for i in step_range(sigmas, progress, f"ocm-{kind}"):
        t, s = sigmas[i], sigmas[i + 1]
        denoised = denoise_checked(model, x, t, i)  # core's one checked model call
        if clip_denoised is not None:
            denoised = denoised.clamp(*clip_denoised)
        emit(callback, i, t, s, x, denoised)
        if s == 0:  # last step: x0 = D, no noise, for every method (as the official code)
            x = denoised
            break
        c, step_counts = clamp_covariance_counted(cov_fn(x, sigma_batch(x, t), cond, denoised).to(x.dtype), c_max)
        counts = step_counts if counts is None else counts + step_counts
        var_max = last_var_max if i == len(sigmas) - 3 else None  # the step landing on sigmas[-2]
        x = gaussian_step(x, denoised, t, s, c, kind=kind, eta=eta, noise=noise, var_max=var_max, c_zero=c_zero)
    n_neg, n_nan = (0, 0) if counts is None else host_copy(counts).tolist()
    return x, n_neg, n_nan


def gaussian_step(x: Tensor, denoised: Tensor, t: float, s: float, c: Tensor | float, *, kind: str, eta: float,
                  noise: SampleNoise, var_max: float | None = None, c_zero: bool | None = None) -> Tensor:
    """One step ``t -> s > 0`` of the moment-matched Gaussian kernel (Ou et al., "Improving Probabilistic Diffusion
    Models With Optimal Diagonal Covariance Matching", ICLR 2025; docs/methods/ocm.md, "Reverse kernel"):
    ``x_s = D + k (x - D) + sqrt(lam2 + a^2 c) z`` with ``(k, lam2, a)`` of :func:`kernel_coefficients` and the
    (already clamped) diagonal covariance ``c``; ``var_max`` bounds the variance (the last stochastic step's clip).

    No noise is drawn where the variance is known to be zero everywhere: ``lam2 = 0`` (a deterministic DDIM step)
    and ``c`` zero. ``c_zero`` says whether ``c`` is zero, as the host knows it (the covariance source); None tests
    the tensor ``c`` itself, which is a host read (a device synchronisation on an accelerator): the sampling loops
    pass ``c_zero`` and read nothing. With ``c_zero=False`` noise is drawn even if ``c`` happens to be all zeros
    (it adds ``0 * z``, but the generators advance).
    """
    k, lam2, a = kernel_coefficients(t, s, kind, eta)
    x = torch.lerp(denoised, x, k)
    var = lam2 + a**2 * c
    if var_max is not None:
        var = var.clamp_max(var_max)
    if lam2 > 0:
        draw = True
    elif not isinstance(var, Tensor):
        draw = var > 0
    elif c_zero is None:
        draw = bool((var > 0).any())
    else:
        draw = not c_zero
    if draw:
        x = x + var.sqrt() * noise.randn_like(x)
    return x


def warn_clamped(n_negative: int, n_nonfinite: int, total: int) -> None:
    if n_negative or n_nonfinite:
        warnings.warn(
            f"covariance: clamped {n_negative} negative and {n_nonfinite} non-finite predicted variances "
            f"(of {total} entries) to [0, c_max]",
            RuntimeWarning,
            stacklevel=3,
        )


def sample_gaussian(
    denoiser, noise: Tensor, sigmas: Tensor, *, kind: str = "ddpm", covariance="zero", eta: float = 0.0,
    cond: Tensor | None = None, generator: GeneratorLike = None, c_max: float | None = None,
    clip_denoised: tuple[float, float] | None | str = "auto", callback=None, progress: bool = False,
    last_var_max: float | None | str = "auto",
) -> GaussianSampleResult:
    """Sample with OCM's Gaussian reverse kernel and any covariance source (OCM and every baseline).

    Args:
        denoiser: ``D(x, sigma, cond)``.
        noise: standard normal ``[B, *shape]``, scaled by ``sigmas[0]`` here.
        sigmas: decreasing schedule ending in 0 (e.g. :func:`steerdiff.core.sigmas.vp_linear`).
        kind: ``ddpm`` (ancestral) or ``ddim`` (with ``eta``; OCM-DDIM is stochastic even at ``eta = 0``).
        covariance: see :func:`as_covariance` (``"zero"`` gives DDPM beta-tilde / DDIM).
        generator: per-sample randomness (as :func:`steerdiff.sample`).
        c_max: upper clamp of ``c``; default the source's (a head's data bound, else inf).
        clip_denoised: ``(lo, hi)`` clip of ``D``, None for none, ``"auto"`` for the source's ``data_range``.
        last_var_max: bound on the variance of the step landing on the smallest nonzero sigma (images; see
            :func:`gaussian_loop`); None for none, ``"auto"`` for the source's (a head's stored default).
    """
    src = as_covariance(covariance)
    check_sample_inputs(denoiser, noise, cond)
    sig = check_sigmas(sigmas).tolist()
    refuse_inf_start(sig)
    if clip_denoised == "auto":
        clip_denoised = src.data_range
    if last_var_max == "auto":
        last_var_max = src.last_var_max
    gens = make_generators(generator, noise.shape[0], noise.device)
    counter = NFECounter(denoiser)
    with torch.no_grad(), src.bind(denoiser) as cov_fn:
        x, neg, nan = gaussian_loop(
            lambda x, s, step=None: counter(x, s, cond), noise * sig[0], sig, cov_fn, kind=kind, eta=eta, cond=cond,
            noise=SampleNoise(gens), c_max=src.c_max if c_max is None else c_max, clip_denoised=clip_denoised,
            callback=callback, progress=progress, last_var_max=last_var_max, c_zero=src.always_zero,
        )
    warn_clamped(neg, nan, noise.numel() * max(0, len(sig) - 2))
    steps_with_c = max(0, len(sig) - 2)
    return GaussianSampleResult(x, counter.nfe(noise.shape[0]), neg, nan, src.extra_vjps_per_step * steps_with_c)


OCM_NOTE = ("covariance heads are the Jacobian of the unguided denoiser; pass a head from "
            "steerdiff.covariance.load_head_for('digits') or train_ocm, a GaussianMixture or a baseline name")


def sample_ocm_steps(
    model, x: Tensor, sigmas: list[float], *, denoiser, covariance, cond: Tensor | None, kind: str, eta: float,
    noise: SampleNoise, callback=None, progress: bool = False,
) -> tuple[Tensor, dict]:
    """The ``ocm-ddpm`` / ``ocm-ddim`` step loop behind :func:`steerdiff.sample` (``x`` already scaled).

    ``D`` is clipped to the covariance source's ``data_range`` (a head trained on bounded data; OCM, Ou et al. 2025,
    "clip_x0"), ``c`` clamped to its ``c_max`` and the last stochastic step's variance bounded by its
    ``last_var_max`` (a head's stored sampling default). Returns ``(x0, {"clamped": number of clamped entries})``.
    """
    refuse_inf_start(sigmas)
    src = as_covariance(covariance)
    with src.bind(denoiser) as cov_fn:
        x, neg, nan = gaussian_loop(model, x, sigmas, cov_fn, kind=kind, eta=eta, cond=cond, noise=noise,
                                    c_max=src.c_max, clip_denoised=src.data_range, callback=callback,
                                    progress=progress, last_var_max=src.last_var_max, c_zero=src.always_zero)
    warn_clamped(neg, nan, x.numel() * max(0, len(sigmas) - 2))
    return x, {"clamped": neg + nan}


# inf_start: the kernels refuse an infinite first level with their own error (they need a finite one).
@register_sampler("ocm-ddpm", stochastic=True, options=("covariance",), required=("covariance",), guidance=False,
                  note=OCM_NOTE, inf_start=True)
def sample_ocm_ddpm(model, x: Tensor, sigmas: list[float], *, covariance, denoiser, cond, noise, callback=None,
                    progress: bool = False, **_) -> tuple[Tensor, dict]:
    """OCM's DDPM-type kernel with a diagonal covariance source (one denoiser evaluation per step)."""
    return sample_ocm_steps(model, x, sigmas, denoiser=denoiser, covariance=covariance, cond=cond, kind="ddpm",
                            eta=0.0, noise=noise, callback=callback, progress=progress)


@register_sampler("ocm-ddim", stochastic=True, eta=True, options=("covariance",), required=("covariance",),
                  guidance=False, note=OCM_NOTE, inf_start=True)
def sample_ocm_ddim(model, x: Tensor, sigmas: list[float], *, covariance, denoiser, cond, noise, eta: float = 0.0,
                    callback=None, progress: bool = False, **_) -> tuple[Tensor, dict]:
    """OCM's DDIM-type kernel (stochastic even at ``eta = 0``: the covariance term adds noise)."""
    return sample_ocm_steps(model, x, sigmas, denoiser=denoiser, covariance=covariance, cond=cond, kind="ddim",
                            eta=eta, noise=noise, callback=callback, progress=progress)
