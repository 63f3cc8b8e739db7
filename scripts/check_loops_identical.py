"""Run every step loop of steerdiff on small fixed-seed problems and save what it returns, to show that a refactor of
the loops changes no number (issue 34, "One step loop").

Covered: :func:`steerdiff.sample` with every registered sampler (plus ``eta``, an ``x0_corrector``, CFG guidance and
a flow start at ``sigma = inf`` where a sampler takes them; the ``ocm-*`` kernels with a mixture oracle and the
shipped ``digits_ocm`` head), the alignment samplers (DAS, default and gradient proposal; TDS; FK steering;
best-of-N; SIR; reward guidance) and the inverse solvers (DPS, DR, CR, HR), on exact Gaussian mixtures
(:class:`steerdiff.models.GaussianMixture`) and the tiny shipped models ``toy2d`` and ``digits_mlp``; and, when
diffusers is installed, the pipeline call (issue 36, the loop's per-step work) on the shipped ``shapes`` pipeline and
the tiny random-weight pipelines of ``tests/tiny_pipelines.py`` (SD with DDIM / Euler / DPM-Solver / UniPC /
v-prediction, SDXL, SD3 with and without T5, FLUX) under CFG, no guidance, APG, a windowed CFG, per-sample scales,
CFG-rescale, CFG-Zero*, a negative prompt, a callback, integer-label guidance through ``sd.sample`` and other
samplers (Heun, DDPM with a generator, an x0-corrector).

Only the public API that predates the refactor is used, so the same script runs on the old code::

    PYTHONPATH=/path/to/old python scripts/check_loops_identical.py save /tmp/old.safetensors
    PYTHONPATH=. python scripts/check_loops_identical.py save /tmp/new.safetensors
    python scripts/check_loops_identical.py compare /tmp/old.safetensors /tmp/new.safetensors

``compare`` checks every saved tensor with ``torch.equal`` (bit-identical) and exits 1 on any difference.
"""

from __future__ import annotations

import math
import sys
import warnings

import torch
from safetensors.torch import load_file, save_file

import steerdiff as sd
from steerdiff.align import best_of_n, das, fk_steering, reward_guidance, sir, tds
from steerdiff.align.rewards import Linear
from steerdiff.inverse import Inpaint, Matrix, measure, solve
from steerdiff.models import GaussianMixture


def _mixture() -> GaussianMixture:
    return GaussianMixture([0.4, 0.6], [[-1.5, 0.5], [1.5, -0.5]], [[0.3, 0.1], [0.2, 0.4]], labels=[0, 1])


def _sample_runs(out: dict) -> None:
    gm = _mixture()
    toy = sd.models.load("toy2d")
    digits = sd.models.load("digits")
    names = sorted(sd.core.SAMPLERS)
    sig_gm = sd.sigmas.karras(6, 0.02, 20.0)
    sig_toy = sd.sigmas.karras(5, 0.02, 20.0)
    sig_inf = torch.cat([torch.tensor([math.inf], dtype=torch.float64), sd.sigmas.karras(5, 0.02, 20.0)])
    for name in names:
        spec = sd.core.SAMPLERS.get(name)
        ocm = name.startswith("ocm-")
        if spec.required and not ocm:  # e.g. ``learned`` needs a trained solver=: not a loop over a fixed rule
            continue
        runs = []
        if ocm:
            sig_vp = sd.sigmas.vp_linear(6)
            runs.append(("gm", gm, sd.randn((6, 2), seeds=0, dtype=torch.float64), sig_vp, {"covariance": gm}))
            runs.append(("digits", digits, sd.randn((3, 1, 8, 8), seeds=1), sd.sigmas.vp_linear(4),
                         {"covariance": sd.covariance.load_head_for("digits", digits), "cond": torch.arange(3)}))
        else:
            runs.append(("gm", gm, sd.randn((6, 2), seeds=0, dtype=torch.float64), sig_gm, {}))
            runs.append(("toy", toy, sd.randn((5, 2), seeds=1), sig_toy, {}))
            runs.append(("gm_cfg", gm, sd.randn((6, 2), seeds=2, dtype=torch.float64), sig_gm,
                         {"cond": torch.tensor([0, 1, 0, 1, 1, 0]), "guidance": sd.guidance.CFG(2.5)}))
            if spec.inf_start:
                runs.append(("gm_inf", gm, sd.randn((6, 2), seeds=3, dtype=torch.float64), sig_inf, {}))
            if spec.corrector:
                runs.append(("gm_corr", gm, sd.randn((6, 2), seeds=4, dtype=torch.float64), sig_gm,
                             {"x0_corrector": lambda d, x, s, i: 0.9 * d + 0.05 * x}))
        if spec.eta:
            base = runs[0]
            runs.append((base[0] + "_eta", base[1], base[2], base[3], {**base[4], "eta": 0.5}))
        for tag, model, noise, sig, kw in runs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                x, stats = sd.sample(model, noise, sig, method=name, generator=7, return_stats=True, **kw)
            key = f"sample/{name}/{tag}"
            out[key] = x.detach()
            out[key + "/nfe"] = torch.tensor([float(stats.nfe), float(stats.calls)], dtype=torch.float64)


def _align_runs(out: dict) -> None:
    gm = _mixture()
    toy = sd.models.load("toy2d")
    reward = Linear([1.0, 0.5])
    sig = sd.sigmas.karras(8, 0.02, 20.0)
    sig0 = torch.cat([sig, torch.zeros(1, dtype=torch.float64)]) if float(sig[-1]) > 0 else sig
    sig_pos = sig0[:-1]  # ends at sigma_min > 0: every step stochastic
    sig_inf = torch.cat([torch.tensor([math.inf], dtype=torch.float64), sig0])
    problems = {"gm": (gm, lambda s: sd.randn((12, 2), seeds=s, dtype=torch.float64)),
                "toy": (toy, lambda s: sd.randn((12, 2), seeds=s))}
    for tag, (model, noise) in problems.items():
        grids = {"0": sig0, "pos": sig_pos} if tag == "gm" else {"0": sig0}
        if tag == "gm":
            grids["inf"] = sig_inf
        for gname, g in grids.items():
            calls = {
                "das": (das, {"alpha": 0.5, "particles": 4, "batch_size": 5}),
                "das_grad": (das, {"alpha": 0.5, "particles": 4, "gradient": True, "tempering": "exp"}),
                "das_grad_clip": (das, {"alpha": 0.5, "particles": 4, "gradient": True, "tempering": "exp",
                                        "grad_clip": 1.0, "shift_clip": 0.5, "vp_compat": True}),
                "tds": (tds, {"alpha": 0.5, "particles": 4}),
                "fk": (fk_steering, {"alpha": 0.5, "particles": 4}),
                "fk_max": (fk_steering, {"alpha": 0.5, "particles": 4, "potential": "max", "resample_every": 2,
                                         "eta": 0.7}),
                "best_of_n": (best_of_n, {"particles": 4, "batch_size": 5}),
                "sir": (sir, {"alpha": 0.5, "particles": 4}),
                "reward_guidance": (reward_guidance, {"alpha": 0.5, "particles": 2}),
                "reward_guidance_const": (reward_guidance, {"alpha": 0.5, "scale": 0.1, "scale_mode": "const"}),
            }
            for name, (fn, kw) in calls.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = fn(model, reward, noise(5), g, generator=3, **kw)
                key = f"align/{name}/{tag}/{gname}"
                out[key + "/samples"] = r.samples.detach()
                out[key + "/rewards"] = r.rewards.detach()
                for field in ("log_weights", "particles_final", "ess", "lambdas", "log_evidence", "nonfinite"):
                    v = getattr(r, field, None)
                    if isinstance(v, torch.Tensor):
                        out[f"{key}/{field}"] = v.detach()
                out[key + "/costs"] = torch.tensor([float(r.nfe), float(r.nfe_grad), float(r.reward_evals)],
                                                   dtype=torch.float64)


def _inverse_runs(out: dict) -> None:
    gm = _mixture()
    op = Matrix(torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    y = measure(op, torch.tensor([[0.5, -0.2]], dtype=torch.float64), noise_std=0.1, generator=0)
    mlp = sd.models.load("digits_mlp")
    inp = Inpaint.center((1, 8, 8))
    x0 = sd.randn((1, 1, 8, 8), seeds=9).clamp(-1, 1)
    y_img = measure(inp, x0, noise_std=0.05, generator=1)
    sig_inf = torch.cat([torch.tensor([math.inf], dtype=torch.float64), sd.sigmas.karras(6, 0.02, 20.0)])
    runs = {
        "gm": (gm, op, y, 0.1, {"steps": 12}),
        "gm_sig": (gm, op, y, 0.1, {"sigmas": sd.sigmas.karras(7, 0.05, 10.0)}),
        "mlp": (mlp, inp, y_img, 0.05, {"steps": 6}),
    }
    for method in ("dps", "dr", "cr", "hr"):
        for tag, (model, operator, meas, std, kw) in runs.items():
            extra = {"scale": 0.5} if method == "dps" and tag.startswith("gm") else {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = solve(model, operator, meas, method=method, noise_std=std, chains=3, generator=2, **kw, **extra)
            key = f"inverse/{method}/{tag}"
            out[key] = r.samples.detach()
            out[key + "/nfe"] = torch.tensor([float(r.nfe), float(r.nfe_vjp)], dtype=torch.float64)
        if method == "dps":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = solve(gm, op, y, method="dps", noise_std=0.1, chains=3, generator=2, sigmas=sig_inf, scale=0.5,
                          eta=0.5)
            out["inverse/dps/gm_inf"] = r.samples.detach()


def _pipeline_runs(out: dict) -> None:
    try:
        import diffusers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("diffusers / transformers not installed: pipeline runs skipped")
        return
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import tiny_pipelines as tp

    from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

    d = Path(tempfile.mkdtemp(prefix="clip_tokenizer_"))
    write_clip_tokenizer(d)

    def shapes():
        from steerdiff.app.protocols.shapes_pipeline import shipped_dir

        return diffusers.DiffusionPipeline.from_pretrained(str(shipped_dir()), use_safetensors=True,
                                                           local_files_only=True)

    builders = {
        "shapes": shapes,
        "sd_ddim": lambda: tp.make_sd(d, "ddim"),
        "sd_euler": lambda: tp.make_sd(d, "euler"),
        "sd_dpm": lambda: tp.make_sd(d, "dpm"),
        "sd_unipc": lambda: tp.make_sd(d, "unipc"),
        "sd_v": lambda: tp.make_sd(d, "ddim", "v_prediction"),
        "sdxl": lambda: tp.make_sdxl(d),
        "sd3": lambda: tp.make_sd3(d),
        "sd3_t5": lambda: tp.make_sd3(d, t5=True),
        "flux": lambda: tp.make_flux(d),
    }
    prompts = ["a red disk", "a blue square"]
    for fam, build in builders.items():
        raw = build()
        raw.set_progress_bar_config(disable=True)
        pipe = sd.pipelines.from_diffusers(raw)
        pipe.set_progress_bar_config(disable=True)
        latents = torch.randn((2, *pipe.latent_shape()), generator=torch.Generator().manual_seed(0))
        seen = []

        def callback(p, i, t, kw, seen=seen):
            seen.append(kw["latents"].detach().clone())
            return kw

        runs = {
            "cfg": {},
            "none": {"guidance_scale": 1.0},
            "cfg_steps3": {"num_inference_steps": 3},
            "apg": {"guidance": sd.guidance.APG(5.0, eta=0.0, norm_threshold=2.0, momentum=-0.5)},
            "apg_window": {"guidance": sd.guidance.APG(4.0, start=0.2, stop=0.8)},
            "cfg_window": {"guidance": sd.guidance.CFG(5.0, start=0.3, stop=1.0)},
            "cfg_rows": {"guidance": sd.guidance.CFG([3.0, 6.0])},
            "cfg_zero": {"guidance": sd.guidance.CFG(0.0)},
            "cfg_rescale": {"guidance_rescale": 0.7},
            "cfg_zero_star": {"guidance": sd.guidance.CFGZeroStar(4.0)},
            "negative": {"negative_prompt": ["blurry", "dark"]},
            "callback": {"callback_on_step_end": callback},
            "heun": {"method": "heun"},
            "ddpm": {"method": "ddpm", "generator": torch.Generator().manual_seed(5)},
            "ddim_eta": {"method": "ddim", "eta": 0.5, "generator": torch.Generator().manual_seed(6)},
            "corrector": {"x0_corrector": lambda den, x, s, i: 0.95 * den},
        }
        if fam == "flux":  # guidance_scale is FLUX's embedded guidance; CFG-rescale is refused there
            runs = {k: v for k, v in runs.items() if k not in ("none", "cfg_rescale")}
            runs["embedded"] = {"guidance_scale": 2.0}
        for tag, kw in runs.items():
            seen.clear()
            kw = {"num_inference_steps": 4, "guidance_scale": 5.0, **kw}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    r = pipe(prompts, latents=latents.clone(), output_type="latent", **kw)
                except (TypeError, ValueError) as e:  # a combination the pipeline refuses: the same on both sides
                    out[f"pipeline/{fam}/{tag}/refused"] = torch.tensor([len(str(e))], dtype=torch.float64)
                    continue
            key = f"pipeline/{fam}/{tag}"
            out[key] = r.latents.detach()
            out[key + "/nfe"] = torch.tensor([float(r.nfe)], dtype=torch.float64)
            for j, z in enumerate(seen):
                out[f"{key}/callback{j}"] = z
        # guidance through sd.sample on the pipeline's own denoiser and structured condition
        cond = pipe.encode(prompts)
        for tag, guidance in (("cfg", sd.guidance.CFG(3.0)), ("apg", sd.guidance.APG(3.0))):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                x = sd.sample(pipe.denoiser, latents.clone(), pipe.default_sigmas(4), method="euler", cond=cond,
                              guidance=guidance)
            out[f"pipeline/{fam}/sample_{tag}"] = x.detach()


def save(path: str) -> None:
    torch.set_num_threads(1)
    out: dict = {}
    _sample_runs(out)
    _align_runs(out)
    _inverse_runs(out)
    _pipeline_runs(out)
    save_file({k: v.contiguous().cpu() for k, v in out.items()}, path)
    print(f"saved {len(out)} tensors to {path}")


def compare(a_path: str, b_path: str) -> int:
    a, b = load_file(a_path), load_file(b_path)
    bad = sorted(set(a) ^ set(b))
    for k in bad:
        print(f"only in {'first' if k in a else 'second'}: {k}")
    for k in sorted(set(a) & set(b)):
        same = a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k])
        if not same and a[k].isnan().any():  # NaN rows (DPS's guarded chains): equal where both are NaN
            same = a[k].shape == b[k].shape and torch.equal(a[k].nan_to_num(7.25), b[k].nan_to_num(7.25))
        if not same:
            bad.append(k)
            diff = (a[k].double() - b[k].double()).abs().max() if a[k].shape == b[k].shape else "shape"
            print(f"DIFFERENT: {k} (max abs diff {diff})")
    print(f"{len(set(a) & set(b))} tensors compared, {len(bad)} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "save":
        save(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
