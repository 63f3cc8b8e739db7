"""Plain model vs NAMM model on one recipe: constraint distance, sliced W2, MMD, FID-digits, cycle error, NFE.

docs/methods/namm.md ("Validation"): both models sample the same seeds with the recipe's sampler (Heun); the NAMM
samples are ``f(x̃)`` of the mirror-space samples ``x̃``; "raw mirror" reports ``l(x̃)`` (what decoding fixes).
Sliced W2 uses 256 projections, MMD the RBF kernel with the median bandwidth, against fresh data (N1) or the test
split (N2).
FID-digits maps brightness-normalised samples to the classifier's range with ``2x - 1``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ...constrain.io import load_namm
from ...constrain.mirror import MirrorDenoiser
from ...core import randn, sample, sigmas
from ...core.sampling import nfe_of
from ...io import read_json
from ...metrics.distributions import mmd_rbf, sliced_wasserstein
from ...models.io import load
from ...train.recipes import resolve_config


def _sampler(recipe: dict):
    s = recipe.get("sampler", {})
    return sigmas.karras(s.get("steps", 30), s.get("sigma_min", 0.002), s.get("sigma_max", 80.0))


@torch.no_grad()
def draw(denoiser, n: int, shape, sig: Tensor, seed: int = 0, labels: Tensor | None = None,
         batch: int = 1000) -> tuple[Tensor, float]:
    """``n`` Heun samples (row ``i`` from seed ``seed + i``) and the NFE per sample."""
    out, nfe = [], 0.0
    for i in range(0, n, batch):
        b = min(batch, n - i)
        c = None if labels is None else labels[i:i + b]
        x, st = sample(denoiser, randn((b, *shape), seeds=seed + i), sig, cond=c, return_stats=True)
        out.append(x)
        nfe = st.nfe
    return torch.cat(out), nfe


def load_run(out: Path, maps: str | None = None):
    """``(namm, mirror denoiser, plain model)`` of a recipe run directory (finetuned maps if present)."""
    maps_dir = out / (maps or ("maps_ft" if (out / "maps_ft" / "namm.json").is_file() else "maps"))
    namm, _ = load_namm(maps_dir)
    mdm = load(out / "mirror" / "final")
    md = MirrorDenoiser(mdm, namm, trained_on=read_json(out / "mirror" / "mirror.json")["forward_fingerprint"])
    plain = load(out / "plain" / "final")
    return namm, md, plain


def compare(recipe_path, n: int = 4000, out_dir=None, maps: str | None = None, seed: int = 0,
            projections: int = 256, cache: bool = True) -> dict:
    """Evaluate a trained recipe run: plain vs NAMM rows (see module docstring); returns a JSON-ready dict.

    With ``cache`` the plain and mirror samples (which depend only on the two diffusion models, ``n`` and ``seed``)
    are kept in ``<run>/cache_<n>.safetensors`` (used only while it is newer than both model files), so inverse maps
    (e.g. a finetuned ``f``) are compared on the same draws without re-sampling.
    """
    from ..recipes.namm import load_constraint_data

    path = resolve_config(recipe_path)
    recipe = read_json(path)
    out = Path(out_dir or recipe["out_dir"])
    namm, md, plain = load_run(out, maps)
    ref, ref_labels, distance = load_constraint_data(recipe["data"], "test")
    digits = recipe["data"]["name"] == "brightness_digits"
    labels = torch.arange(n) % 10 if digits else None
    sig = _sampler(recipe)
    cached = out / f"cache_{n}.safetensors" if seed == 0 else out / f"cache_{n}_seed{seed}.safetensors"
    models = [out / "plain" / "final" / "model.safetensors", out / "mirror" / "final" / "model.safetensors"]
    fresh = cached.is_file() and all(cached.stat().st_mtime > m.stat().st_mtime for m in models)
    if cache and fresh:
        from ...io import load_tensors

        tensors = load_tensors(cached)
        x_plain, x_mirror = tensors["plain"], tensors["mirror"]
        nfe_plain = nfe_mirror = float(nfe_of("heun", len(sig) - 1))
    else:
        x_plain, nfe_plain = draw(plain, n, md.sample_shape, sig, seed, labels)
        x_mirror, nfe_mirror = draw(md, n, md.sample_shape, sig, seed, labels)
        if cache:
            from ...io import save_tensors

            save_tensors({"plain": x_plain, "mirror": x_mirror}, cached)
    with torch.no_grad():
        x_namm = torch.cat([namm.decode(x_mirror[i:i + 1000]) for i in range(0, n, 1000)])
        held = namm.evaluate(ref)
    rows = {}
    for name, x, nfe in (("plain", x_plain, nfe_plain), ("namm", x_namm, nfe_mirror),
                         ("raw_mirror", x_mirror, nfe_mirror)):
        d = distance(x)
        row = {"nfe": nfe, "constraint_mean": float(d.mean()), "constraint_median": float(d.median()),
               "sliced_w2": sliced_wasserstein(x, ref, n_projections=projections, seed=seed),
               "mmd": mmd_rbf(x, ref)}
        if digits:
            row.update(_fid(x, ref))
        rows[name] = row
    res = {"recipe": path.name, "n": n, "reference": "test split" if digits else f"{ref.shape[0]} fresh data points",
           "sampler": f"heun, {len(sig) - 1} steps, karras({float(sig[-2]):g}, {float(sig[0]):g})",
           "maps": str(maps or "auto"), "heldout": held, "rows": rows,
           "ratio_constraint_plain_over_namm": rows["plain"]["constraint_mean"] / rows["namm"]["constraint_mean"],
           "ratio_sw2_namm_over_plain": rows["namm"]["sliced_w2"] / rows["plain"]["sliced_w2"]}
    if digits:
        res["ratio_fid_namm_over_plain"] = rows["namm"]["fid_digits"] / rows["plain"]["fid_digits"]
    return res


_CLF = {}


def _fid(x: Tensor, ref: Tensor) -> dict:
    from ...constrain.distances import brightness_to_classifier
    from ...metrics.images import classifier_features, frechet_distance

    if "clf" not in _CLF:
        _CLF["clf"] = load("digits_classifier")
    clf = _CLF["clf"]
    f_ref = classifier_features(clf, brightness_to_classifier(ref))
    f_x = classifier_features(clf, brightness_to_classifier(x))
    return {"fid_digits": frechet_distance(f_ref, f_x)}
