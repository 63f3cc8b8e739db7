"""deepinv's DPS, DiffPIR and DDRM on steerdiff's exact mixture problems (benchmarks/inverse_deepinv.py and the
optional tests/inverse/test_deepinv_reference.py).

deepinv (0.5.0) is not a steerdiff dependency. Its ``__init__`` imports torchvision, whose PyPI wheels are CUDA
builds (``torchvision/_C.so`` links ``libc10_cuda.so``) that do not load beside the CPU torch; CPU wheels are not on
PyPI. The samplers used here (``deepinv.sampling.DPS`` / ``DiffPIR`` / ``DDRM``, ``deepinv.physics``,
``deepinv.optim.L2``) never call torchvision, so :func:`load` imports deepinv with an inert stand-in for torchvision
(installed only for the import, removed afterwards) when the real one cannot be imported.

Units. deepinv's samplers work on images in [0, 1] (DPS and DiffPIR carry ``[-1, 1]`` internally and clip / clamp
the denoised estimate to it). A problem in steerdiff units ``x`` is mapped to ``x01 = x / (2 c) + 1/2`` with ``c``
the 99.9% quantile of ``|x|`` under the prior (so the clip touches 0.1% of the prior mass); the measurement becomes
``y01 = y / (2 c) + A 1 / 2`` with noise ``sigma_y / (2 c)``, the denoiser ``D01(x01, s01) = D(c (2 x01 - 1),
2 c s01) / (2 c) + 1/2`` (exact: a Gaussian mixture's posterior mean is affine-equivariant), and samples map back
with ``x = c (2 x01 - 1)``. The operator is a ``DecomposablePhysics`` from the thin SVD of the problem's matrix.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import torch

_STUB = "steerdiff-bench torchvision stand-in"


class _Inert:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise RuntimeError(f"{_STUB}: torchvision is not available beside the CPU torch")

    def __getattr__(self, name):
        return _Inert()

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        m.__version__ = "0+stub"
        return m

    def exec_module(self, module):
        pass


def available() -> bool:
    return importlib.util.find_spec("deepinv") is not None


def load():
    """``deepinv``, importing it with the torchvision stand-in if the real torchvision does not import."""
    if "deepinv" in sys.modules:
        return sys.modules["deepinv"]
    try:
        importlib.import_module("torchvision")
        stub = False
    except Exception:  # the CUDA wheel beside the CPU torch raises RuntimeError / OSError
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        stub = True
    if not stub:
        return importlib.import_module("deepinv")
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("deepinv")
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]  # other libraries probing for torchvision see it missing again


def data_scale(prior, n: int = 20000) -> float:
    x = prior.sample(n, generator=torch.Generator().manual_seed(5))
    return float(torch.quantile(x.abs().flatten(), 0.999))


class Adapter:
    """One steerdiff problem (``steerdiff.app.protocols.inverse.Problem``) in deepinv's units, with an NFE count."""

    def __init__(self, problem, c: float | None = None, unit: bool = False):
        dinv = load()
        self.dinv, self.p = dinv, problem
        # unit=True: no scaling (x01 = x + 1/2), for the DDRM cross-check, whose deepinv code never clips
        self.c = 0.5 if unit else (data_scale(problem.prior) if c is None else c)
        A = problem.operator.matrix(torch.float64)
        self.A = A
        m, d = A.shape
        self.d, self.m = d, m
        u, s, vh = torch.linalg.svd(A, full_matrices=True)
        r = int((s > s.max() * 1e-10).sum())
        V, Ur = vh.T, u[:, :r]
        sv = torch.zeros(d, dtype=torch.float64)
        sv[:r] = s[:r]

        def pad(t):
            out = torch.zeros(*t.shape[:-1], d, dtype=t.dtype)
            out[..., :r] = t
            return out

        self.physics = dinv.physics.DecomposablePhysics(
            V_adjoint=lambda x: x @ V.to(x.dtype), V=lambda c_: c_ @ V.T.to(c_.dtype),
            U=lambda c_: c_[..., :r] @ Ur.T.to(c_.dtype), U_adjoint=lambda y: pad(y @ Ur.to(y.dtype)),
            mask=sv.reshape(1, 1, 1, d),
            noise_model=dinv.physics.GaussianNoise(sigma=problem.noise_std / (2 * self.c)))
        self.nfe = 0
        adapter = self

        class MixtureDenoiser(dinv.models.Denoiser):
            def forward(self, x, sigma, *args, **kwargs):
                adapter.nfe += 1
                dt = x.dtype
                x = x.to(torch.float64)
                b = x.shape[0]
                sig = torch.as_tensor(sigma, dtype=torch.float64).flatten()
                sig = sig.expand(b) if sig.numel() == 1 else sig
                xs = adapter.c * (2 * x.reshape(b, -1) - 1)
                out = adapter.p.prior(xs, 2 * adapter.c * sig)
                return (out / (2 * adapter.c) + 0.5).reshape(x.shape).to(dt)

        self.denoiser = MixtureDenoiser()

    def y01(self, chains: int) -> torch.Tensor:
        y = self.p.y.to(torch.float64)  # [1, m]
        y01 = y / (2 * self.c) + self.A.sum(1) / 2
        return y01.reshape(1, 1, 1, self.m).expand(chains, 1, 1, self.m).clone()

    def to_x(self, x01: torch.Tensor) -> torch.Tensor:
        return self.c * (2 * x01.reshape(x01.shape[0], -1).to(torch.float64) - 1)

    def dps(self, chains: int, nfe: int, weight: float, seed: int) -> torch.Tensor:
        """deepinv's DPS (its defaults: VP schedule, DDPM solver, norm guidance, a final denoising step): ``nfe``
        solver steps."""
        s = self.dinv.sampling.DPS(self.denoiser, num_steps=nfe, weight=weight, dtype=torch.float64,
                                   rng=torch.Generator().manual_seed(seed))
        self.nfe = 0
        with torch.no_grad():
            x = s(self.y01(chains), self.physics, seed=seed)
        return self.to_x(x)

    def diffpir(self, chains: int, nfe: int, seed: int, lambda_: float = 7.0, zeta: float = 0.1) -> torch.Tensor:
        s = self.dinv.sampling.DiffPIR(self.denoiser, self.dinv.optim.L2(), sigma=self.p.noise_std / (2 * self.c),
                                       max_iter=nfe, lambda_=lambda_, zeta=zeta)
        self.nfe = 0
        torch.manual_seed(seed)
        with torch.no_grad():
            x = s(self.y01(chains), self.physics)
        return self.to_x(x)

    def ddrm(self, chains: int, sigmas, seed: int, eta: float = 0.85, etab: float = 1.0) -> torch.Tensor:
        """deepinv's DDRM on steerdiff-unit levels ``sigmas`` (a final 0 appended: its last call is ``D(x, 0) = x``)."""
        lv = [float(v) / (2 * self.c) for v in sigmas] + [0.0]
        s = self.dinv.sampling.DDRM(self.denoiser, sigmas=lv, eta=eta, etab=etab)
        self.nfe = 0
        torch.manual_seed(seed)
        x = s(self.y01(chains), self.physics)
        return self.to_x(x)
