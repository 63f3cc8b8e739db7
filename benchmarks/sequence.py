"""All-at-once vs autoregressive sequence generation on signal-driven trajectories (DAWN, Cheng et al. 2025, "DAWN:
Dynamic frame Avatar With Non-autoregressive diffusion framework"; docs/methods/sequence.md).

Both arms share one network (a SequenceTransformer of the same size), the optimizer steps, the batch size and the data
stream (the same trajectories every step: steerdiff.data.driven, 4 known frames then 16-32 frames). The all-at-once arm
trains on the whole 16-32 frames and generates S frames in one sampler run; the autoregressive arm trains on windows
of 16 frames after 4 known ones and generates 16-frame chunks, each conditioned on the last 4 frames it generated.
Evaluated on a fixed test set (seed 1234) at S = 32, 64, 128 (past the training lengths) with the same sampler::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/sequence.py --seeds 0 1 2

Training checkpoints under runs/sequence/ (a killed run resumes from them); results in benchmarks/results/sequence/.
``--arms all_at_once all_at_once_global autoregressive --name sequence_split`` adds the all-at-once arm whose known
frames are global tokens (SequenceTransformer global_context=True), the other arms loading from their checkpoints.
``--anchor-std 0.5 --marker-noise 0.1 --tag anchor`` gives every trajectory its own rest point, shown in each frame by
a jittered marker (a quantity that persists, the analogue of identity in a talking head).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, markdown_table, provenance, provenance_line, results_dir, write_json, write_text  # noqa: E402

import steerdiff as sd  # noqa: E402
from steerdiff.data.driven import DrivenSpring, driven_batch, simulate  # noqa: E402
from steerdiff.temporal import generate_autoregressive, generate_sequence, sequence_model  # noqa: E402
from steerdiff.temporal.sequence_train import SequenceTrainConfig, train_sequence  # noqa: E402

ARMS = ("all_at_once", "all_at_once_global", "autoregressive")
DEFAULT_ARMS = ("all_at_once", "autoregressive")
LABELS = {"all_at_once": "all-at-once (banded context)", "all_at_once_global": "all-at-once (global context)",
          "autoregressive": "autoregressive"}
LENGTHS = (32, 64, 128)
TEST_SEED = 1234


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(((a - b) ** 2).mean()))


def velocity_signal_corr(frames: np.ndarray, signal: np.ndarray) -> float:
    """Pearson correlation of the frame-to-frame velocity ``p_{t+1} - p_t`` with the signal ``u_t`` that drives that
    step, pooled over sequences, steps and axes (each series centred per sequence and axis)."""
    vel = np.diff(frames, axis=1)
    u = signal[:, :-1]
    vel = vel - vel.mean(axis=1, keepdims=True)
    u = u - u.mean(axis=1, keepdims=True)
    return float((vel * u).sum() / np.sqrt((vel**2).sum() * (u**2).sum()))


def block_rmse(frames: np.ndarray, truth: np.ndarray, block: int) -> list[float]:
    """RMSE over each run of ``block`` frames: where along the sequence the error sits."""
    return [rmse(frames[:, t:t + block], truth[:, t:t + block]) for t in range(0, frames.shape[1], block)]


def seam_ratio(frames: np.ndarray, chunk: int) -> float:
    """Mean acceleration magnitude ``|p_{t+1} - 2 p_t + p_{t-1}|`` at the autoregressive chunk borders (t = j chunk - 1
    and j chunk, j >= 1) over its mean at every other frame: 1 for a motion with no seams."""
    acc = np.linalg.norm(frames[:, 2:] - 2 * frames[:, 1:-1] + frames[:, :-2], axis=-1)  # t = 1 .. S-2
    t = np.arange(1, frames.shape[1] - 1)
    seam = (t % chunk == 0) | ((t + 1) % chunk == 0)
    return float(acc[:, seam].mean() / acc[:, ~seam].mean())


def oracle_sample(test, system: DrivenSpring, seed: int) -> np.ndarray:
    """The true process run again from the true state (and rest point) at the last context frame with fresh process
    noise and marker jitter: a perfect sampler's draw, whose error to the recorded trajectory is the irreducible one."""
    k = test.context
    sig = test.signal[:, k - 1:].double().numpy()
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(sig.shape)
    anchor = test.anchor.double().numpy()[:, None]
    p, _ = simulate(system, sig, test.frames[:, k - 1, :2].double().numpy() - anchor[:, 0],
                    test.velocity[:, k - 1].double().numpy(), noise)
    p = p[:, 1:] + anchor
    if system.marker_noise is not None:
        p = np.concatenate([p, anchor + system.marker_noise * rng.standard_normal(p.shape)], axis=-1)
    return p


def train_arm(arm: str, seed: int, args, system: DrivenSpring) -> tuple[torch.nn.Module, dict]:
    cfg = SequenceTrainConfig(mode=mode_of(arm), steps=args.steps, batch_size=args.batch, lr=args.lr,
                              context=args.context, chunk=args.chunk, overlap=args.context, data_seed=seed, seed=seed,
                              checkpoint_every=250)
    torch.manual_seed(seed)
    extra = {"global_context": True} if arm == "all_at_once_global" else {}
    model = sequence_model(frame_shape=(system.frame_dim,), width=args.width, depth=args.depth, heads=args.heads,
                           window=args.window, **extra)
    run_dir = ROOT / "runs" / "sequence" / args.tag / f"seed{seed}" / arm
    info = train_sequence(model, cfg, run_dir, system, log_every=500)
    sd.models.save(model, run_dir / "model")
    info["config"] = cfg.to_dict()
    info["params"] = sum(p.numel() for p in model.parameters())
    return model, info


def mode_of(arm: str) -> str:
    """The training/generation strategy of an arm (both all-at-once arms share one)."""
    return "autoregressive" if arm == "autoregressive" else "all_at_once"


def generate(arm: str, model, signal, past, args, seed: int):
    if mode_of(arm) == "all_at_once":
        return generate_sequence(model, signal, past, steps=args.sample_steps, seed=seed, return_stats=True)
    return generate_autoregressive(model, signal, past, chunk=args.chunk, overlap=args.context,
                                   steps=args.sample_steps, seed=seed, return_stats=True)


def evaluate(models: dict, test, oracle: np.ndarray, args) -> dict:
    out: dict = {arm: {} for arm in models}
    truth = test.target.double().numpy()
    anchor = test.anchor.double().numpy()[:, None]
    mean = test.mean[:, test.context:].double().numpy()
    for arm, model in models.items():
        for s in LENGTHS:
            with torch.no_grad():
                frames, stats = generate(arm, model, test.target_signal[:, :s], test.past, args, seed=10_000)
            f = frames.double().numpy()
            row = {"rmse": rmse(f, truth[:, :s]), "rmse_to_mean": rmse(f, mean[:, :s]),
                   "rmse_last32": rmse(f[:, -32:], truth[:, s - 32:s]), "nfe": stats["nfe"], "calls": stats["calls"]}
            row["excess"] = float(np.sqrt(max(row["rmse"] ** 2 - rmse(oracle[:, :s], truth[:, :s]) ** 2, 0.0)))
            if s == max(LENGTHS):
                row["block_rmse"] = block_rmse(f, truth[:, :s], args.chunk)
                sig = test.target_signal[:, :s].double().numpy()
                row["signal_corr"] = velocity_signal_corr(f[..., :2], sig)
                row["seam_ratio"] = seam_ratio(f[..., :2], args.chunk)
                if f.shape[-1] > 2:  # how far the generated marker strays from the true rest point, by block
                    row["marker_block_rmse"] = block_rmse(f[..., 2:], np.broadcast_to(anchor, f[..., 2:].shape),
                                                          args.chunk)
            out[arm][s] = row
    # Wall time per generated frame at the longest S, the arms timed in turn within this run (ratios are what count).
    s = max(LENGTHS)
    for batch in (1, test.frames.shape[0]):
        times = {arm: [] for arm in models}
        for _ in range(args.timing_repeats):
            for arm, model in models.items():
                with torch.no_grad():
                    start = time.perf_counter()
                    generate(arm, model, test.target_signal[:batch, :s], test.past[:batch], args, seed=20_000)
                    times[arm].append((time.perf_counter() - start) / (batch * s))
        for arm in models:
            out[arm][f"ms_per_frame_b{batch}"] = 1e3 * float(np.median(times[arm]))
    return out


def reference(test, oracle: np.ndarray, args) -> dict:
    truth = test.target.double().numpy()
    sig = test.target_signal.double().numpy()
    mean = test.mean[:, test.context:].double().numpy()
    ref = {s: {"oracle_rmse": rmse(oracle[:, :s], truth[:, :s]), "mean_rmse": rmse(mean[:, :s], truth[:, :s])}
           for s in LENGTHS}
    ref["oracle_block_rmse"] = block_rmse(oracle, truth, args.chunk)
    ref["truth_signal_corr"] = velocity_signal_corr(truth[..., :2], sig)
    ref["truth_seam_ratio"] = seam_ratio(truth[..., :2], args.chunk)
    ref["oracle_signal_corr"] = velocity_signal_corr(oracle[..., :2], sig)
    if truth.shape[-1] > 2:
        anchor = np.broadcast_to(test.anchor.double().numpy()[:, None], truth[..., 2:].shape)
        ref["oracle_marker_block_rmse"] = block_rmse(oracle[..., 2:], anchor, args.chunk)
    return ref


def summary_rows(per_seed: list[dict], ref: dict, n_test: int, arms: list[str]) -> list[list[str]]:
    def stat(values: list[float], digits: int = 4) -> str:
        v = np.asarray(values, dtype=float)
        return f"{v.mean():.{digits}f}" + (f" ± {v.std(ddof=1):.{digits}f}" if len(v) > 1 else "")

    rows = []
    for arm in arms:
        get = [r[arm] for r in per_seed]
        cells = [LABELS[arm]]
        cells += [stat([g[s]["rmse"] for g in get]) for s in LENGTHS]
        cells.append(stat([g[128]["rmse"] / g[32]["rmse"] for g in get], 3))
        cells.append(stat([g[128]["excess"] / g[32]["excess"] for g in get], 3))
        cells.append(stat([g[128]["signal_corr"] / ref["truth_signal_corr"] for g in get], 3))
        cells.append(stat([g[128]["seam_ratio"] for g in get], 3))
        cells.append(stat([g["ms_per_frame_b1"] for g in get], 3))
        cells.append(stat([g[f"ms_per_frame_b{n_test}"] for g in get], 3))
        rows.append(cells)
    rows.append(["oracle (true process, fresh noise)"] + [f"{ref[s]['oracle_rmse']:.4f}" for s in LENGTHS]
                + [f"{ref[128]['oracle_rmse'] / ref[32]['oracle_rmse']:.3f}", "-",
                   f"{ref['oracle_signal_corr'] / ref['truth_signal_corr']:.3f}", f"{ref['truth_seam_ratio']:.3f}",
                   "-", "-"])
    return rows


def profile_rows(per_seed: list[dict], ref: dict, arms: list[str], key: str = "block_rmse") -> list[list[str]]:
    """Mean over seeds of the RMSE of each block of frames at S = 128 (``key``: of the whole frames, or
    ``marker_block_rmse``: of the marker channels to the true rest point)."""
    s = max(LENGTHS)
    rows = [[LABELS[arm]] + [f"{v:.4f}" for v in np.mean([r[arm][s][key] for r in per_seed], 0)]
            for arm in arms]
    return rows + [["oracle"] + [f"{v:.4f}" for v in ref[f"oracle_{key}"]]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--context", type=int, default=4, help="known frames; also the autoregressive overlap")
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--sample-steps", type=int, default=12, help="Heun steps per sampler run (NFE 2 steps - 1)")
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--timing-repeats", type=int, default=3)
    p.add_argument("--period", type=float, default=None, help="spring period in frames (default DrivenSpring's)")
    p.add_argument("--gain", type=float, default=None, help="signal gain (default DrivenSpring's)")
    p.add_argument("--noise", type=float, default=None, help="process noise std (default DrivenSpring's)")
    p.add_argument("--burn-in", type=int, default=None, help="frames simulated before recording (default 64)")
    p.add_argument("--anchor-std", type=float, default=0.0, help="std of each trajectory's rest point (default 0)")
    p.add_argument("--marker-noise", type=float, default=None,
                   help="add the rest point to each frame as a marker with this jitter (frames of 4 values)")
    p.add_argument("--tag", default="main", help="run folder under runs/sequence/ and suffix of the result files")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(DEFAULT_ARMS),
                   help="arms to train (or load from their checkpoints) and compare, timed in turn in one run; "
                        "all_at_once_global makes the known frames global tokens (SequenceTransformer "
                        "global_context=True)")
    p.add_argument("--name", default=None, help="stem of the result files (default sequence[_TAG])")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    meta = provenance(argv)
    defaults = DrivenSpring()
    system = DrivenSpring(period=args.period or defaults.period, gain=args.gain or defaults.gain,
                          noise=defaults.noise if args.noise is None else args.noise,
                          burn_in=args.burn_in or defaults.burn_in, anchor_std=args.anchor_std,
                          marker_noise=args.marker_noise)
    test = driven_batch(args.n_test, max(LENGTHS), TEST_SEED, context=args.context, system=system)
    oracle = oracle_sample(test, system, seed=TEST_SEED + 1)
    ref = reference(test, oracle, args)
    out_dir = results_dir("sequence")
    stem = args.name or ("sequence" if args.tag == "main" else f"sequence_{args.tag}")
    per_seed, training = [], {}
    for seed in args.seeds:
        models = {}
        for arm in args.arms:
            models[arm], training[f"{arm}/seed{seed}"] = train_arm(arm, seed, args, system)
            print(f"seed {seed} {arm}: trained ({training[f'{arm}/seed{seed}']['train_seconds']:.0f} s)", flush=True)
        per_seed.append(evaluate(models, test, oracle, args))
        print({arm: {s: round(per_seed[-1][arm][s]["rmse"], 4) for s in LENGTHS} for arm in args.arms}, flush=True)
        result = {"meta": meta, "args": vars(args), "system": system.to_dict(), "reference": ref,
                  "seeds": args.seeds[: len(per_seed)], "per_seed": per_seed, "training": training}
        write_json(out_dir / f"{stem}.json", result)
        header = ["arm", *(f"RMSE S={s}" for s in LENGTHS), "growth 128/32", "excess growth", "signal share",
                  "seam ratio", "ms/frame (B=1)", f"ms/frame (B={args.n_test})"]
        block_header = ["arm"] + [f"{t}-{t + args.chunk}" for t in range(0, max(LENGTHS), args.chunk)]
        block_align = "l" + "r" * (max(LENGTHS) // args.chunk)
        seeds_done = ", ".join(map(str, args.seeds[: len(per_seed)]))
        text = "\n\n".join([
            "# All-at-once vs autoregressive sequence generation (DAWN)",
            provenance_line(meta),
            f"Seeds {seeds_done} (mean ± std over seeds); {args.n_test} test sequences (seed {TEST_SEED}), trained on "
            f"16-32 frames after {args.context} known ones, {args.steps} steps x batch {args.batch} per arm; Heun "
            f"{args.sample_steps} steps (NFE {2 * args.sample_steps - 1} per sampler run); autoregressive chunk "
            f"{args.chunk}, overlap {args.context}. System: period {system.period:g}, tau {system.tau:g}, gain "
            f"{system.gain:g}, noise {system.noise:g}"
            + (f", rest point std {system.anchor_std:g}" if system.anchor_std else "")
            + (f", marker jitter {system.marker_noise:g}" if system.marker_noise is not None else "") + ".",
            markdown_table(header, summary_rows(per_seed, ref, args.n_test, args.arms), "l" + "r" * (len(header) - 1)),
            f"RMSE by {args.chunk}-frame block at S={max(LENGTHS)} (mean over seeds; training lengths end at "
            f"frame {SequenceTrainConfig().max_length}):",
            markdown_table(block_header, profile_rows(per_seed, ref, args.arms), block_align),
            *([f"RMSE of the marker channels to the true rest point by {args.chunk}-frame block at S={max(LENGTHS)} "
               f"(the drift of the persistent quantity; the marker jitter alone gives {system.marker_noise:g}):",
               markdown_table(block_header, profile_rows(per_seed, ref, args.arms, "marker_block_rmse"),
                              block_align)] if system.marker_noise is not None else []),
            "RMSE: to the recorded trajectory over the S generated frames. growth: RMSE(128) / RMSE(32). excess: "
            "sqrt(RMSE^2 - oracle RMSE^2), the model's error beyond the irreducible process noise; its growth "
            "128/32. signal share: correlation of the generated velocity with the driving signal over that of the "
            f"recorded trajectories ({ref['truth_signal_corr']:.3f}), at S=128. seam ratio: mean |acceleration| at "
            f"the {args.chunk}-frame chunk borders over elsewhere, at S=128 (recorded trajectories: the oracle row). "
            "ms/frame: wall time per generated frame at S=128, the arms timed in turn in this run (median of "
            f"{args.timing_repeats}).",
        ])
        write_text(out_dir / f"{stem}.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
