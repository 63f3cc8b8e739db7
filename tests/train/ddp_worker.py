"""One rank of a data-parallel training run, for tests/train/test_ddp.py (started by ``launch_ranks``).

    python ddp_worker.py MODE[,MODE...] OUT

Modes (run in the order given, in one process group): ``equal`` (two 50-step DDP runs and their one-process
references), ``kill`` (a DDP run whose processes exit at step 25, after the checkpoint of step 20), ``resume``
(resume that run to the end), ``errors`` (calls that must raise on every rank). Tensors go to
``OUT/*.safetensors``, messages to ``OUT/*.json``; the test compares.
The model and data builders are also loaded by the test itself (importing this file only sets one thread).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

torch.set_num_threads(1)

from steerdiff import distributed as sdd  # noqa: E402
from steerdiff.models.dit import DiT  # noqa: E402
from steerdiff.models.mlp import MLP  # noqa: E402
from steerdiff.models.precond import EDMPrecond  # noqa: E402
from steerdiff.train import train  # noqa: E402

STEPS = 50
KILL_AT = 25


def dit_model(seed: int = 1) -> EDMPrecond:
    """A tiny class-conditional DiT with dropout (so that the per-chunk dropout RNG matters)."""
    torch.manual_seed(seed)
    return EDMPrecond(DiT(img_size=4, in_channels=1, patch_size=2, width=8, depth=1, heads=2, num_classes=3,
                          fourier_dim=4, dropout=0.2))


def dit_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 1, 4, 4, generator=g), torch.randint(0, 3, (64,), generator=g)


def dit_config(**changes) -> dict:
    return {**dict(steps=STEPS, batch_size=16, lr=3e-3, warmup_steps=5, checkpoint_every=100, log_every=10,
                   p_uncond=0.2, ema_decay=0.9, seed=4), **changes}


def mlp_model(seed: int = 2) -> EDMPrecond:
    torch.manual_seed(seed)
    return EDMPrecond(MLP(dim=2, hidden=[32, 32], num_classes=[2, 2], cond_dim=4, fourier_dim=8, noise_dim=8))


def mlp_stream(step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A data stream: fresh two-slot labelled blobs every step, a pure function of the step."""
    g = torch.Generator().manual_seed(1000 + step)
    label = torch.randint(0, 2, (batch_size,), generator=g)
    x = torch.randn(batch_size, 2, generator=g) * 0.2 + torch.stack([label * 2.0 - 1.0, torch.zeros(batch_size)], 1)
    return x, torch.stack([label, (x[:, 1] > 0).long()], 1)


def mlp_config(**changes) -> dict:
    return {**dict(steps=STEPS, batch_size=16, lr=3e-3, warmup_steps=5, checkpoint_every=100, log_every=10,
                   p_null=0.3, ema_decay=0.9, seed=9), **changes}


def tensors(result) -> dict[str, torch.Tensor]:
    """Raw and EMA weights of a :class:`TrainResult`."""
    return {**{f"raw.{k}": v.contiguous() for k, v in result.raw_model.state_dict().items()},
            **{f"ema.{k}": v.contiguous() for k, v in result.model.state_dict().items()}}


def losses(result) -> list[float]:
    return [h["loss"] for h in result.history]


def _equal(out: Path, ctx: sdd.DistContext) -> None:
    r = ctx.rank
    # Each rank builds its model from a different seed: the trainer must start every rank from rank 0's weights.
    dit = train(dit_model(seed=1 + 100 * r), dit_data(), dit_config(), out / "ddp_dit", progress=False)
    mlp = train(mlp_model(seed=2 + 100 * r), mlp_stream, mlp_config(data_shards=4), out / "ddp_mlp", progress=False)
    save_file(tensors(dit), out / f"dit_rank{r}.safetensors")
    save_file(tensors(mlp), out / f"mlp_rank{r}.safetensors")
    log = {"dit": losses(dit), "mlp": losses(mlp)}
    # The one-process references (this process has one thread, like a one-process run): rank 0 the DiT (and the
    # same run with one chunk, to show that the chunking is visible), rank 1 the MLP stream.
    one = sdd.SINGLE
    if r == 0:
        ref = train(dit_model(), dit_data(), dit_config(data_shards=2), out / "one_dit", progress=False, dist=one)
        plain = train(dit_model(), dit_data(), dit_config(), out / "one_dit_1", progress=False, dist=one)
        save_file(tensors(ref), out / "dit_one.safetensors")
        save_file(tensors(plain), out / "dit_one_1shard.safetensors")
        log["dit_one"] = losses(ref)
    else:
        ref = train(mlp_model(), mlp_stream, mlp_config(data_shards=4), out / "one_mlp", progress=False, dist=one)
        save_file(tensors(ref), out / "mlp_one.safetensors")
        log["mlp_one"] = losses(ref)
    (out / f"losses_rank{r}.json").write_text(json.dumps(log))


def _kill(out: Path, ctx: sdd.DistContext) -> None:
    def die(info: dict) -> None:
        if info["step"] == KILL_AT:
            os._exit(17)  # no clean-up, no final checkpoint: as a killed job

    train(dit_model(), dit_data(), dit_config(checkpoint_every=10), out / "split", progress=False, callback=die)
    raise SystemExit("the run went past the kill step")


def _resume(out: Path, ctx: sdd.DistContext) -> None:
    done = []
    result = train(dit_model(seed=77), dit_data(), dit_config(checkpoint_every=10), out / "split", resume=True,
                   progress=False, callback=lambda info: done.append(info["step"]))
    save_file(tensors(result), out / f"resumed_rank{ctx.rank}.safetensors")
    (out / f"resumed_rank{ctx.rank}.json").write_text(json.dumps({"steps_run": done}))


def _errors(out: Path, ctx: sdd.DistContext) -> None:
    r = ctx.rank
    cases = {
        "config_differs": lambda: train(dit_model(), dit_data(), dit_config(lr=1e-3 * (1 + r)), out / "e1",
                                        progress=False),
        "data_differs": lambda: train(dit_model(), dit_data(seed=r), dit_config(), out / "e2", progress=False),
        "batch_not_divisible": lambda: train(dit_model(), dit_data(), dit_config(batch_size=15), out / "e3",
                                             progress=False),
        "shards_not_multiple": lambda: train(dit_model(), dit_data(), dit_config(batch_size=18, data_shards=3),
                                             out / "e4", progress=False),
    }
    seen = {}
    for name, call in cases.items():
        try:
            call()
            seen[name] = "no error"
        except ValueError as err:
            seen[name] = f"ValueError: {err}"
        except Exception as err:  # noqa: BLE001 - the test reports what else came
            seen[name] = f"{type(err).__name__}: {err}"
    (out / f"errors_rank{r}.json").write_text(json.dumps(seen))


def main(mode: str, out: str) -> None:
    ctx = sdd.init(backend="gloo", timeout=60)
    try:
        for name in mode.split(","):
            {"equal": _equal, "kill": _kill, "resume": _resume, "errors": _errors}[name](Path(out), ctx)
    finally:
        sdd.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
