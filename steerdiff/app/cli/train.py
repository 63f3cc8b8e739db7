"""``steerdiff train``: train a model from a JSON recipe with the generic loop (checkpoints, resume, final model).

    steerdiff train digits_unet
    steerdiff train configs/digits_unet.json --set steps=2000 --set lr=1e-3 --out runs/digits
    steerdiff train digits_unet --resume

The recipe's ``train`` section can be overridden field by field with ``--set``; the run directory holds the
checkpoints, the log and the final model.

Data-parallel training: ``torchrun --nproc_per_node=2 --no-python -- steerdiff train digits_unet`` (or ``accelerate
launch``, which sets the same variables) splits each global batch over the processes and averages the gradients
(steerdiff.train.ddp); the result equals a one-process run with ``--set data_shards=2``. Rank 0 alone prints and
writes the run directory; ``--resume`` needs the same number of processes.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import types
import typing

import click
import torch

from ._common import check_out, device_option, progress_option, refuse_dtype
from ._shard import begin, end, rank_device


@click.command("train")
@click.argument("config")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in the run directory.")
@click.option("--out", default=None, help="Run directory (default: the recipe's out_dir).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a field of the recipe's train section, e.g. --set steps=2000 (VALUE is read as JSON: "
                   "numbers, true/false, null; anything else is a string). Repeatable.")
@device_option
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True,
              help="float32, or bfloat16 mixed precision (forward and loss under torch.autocast; weights, optimizer "
                   "and EMA stay float32; the recipe field autocast). float16 is refused: it needs loss scaling.")
@progress_option
@click.pass_context
def train_cmd(click_ctx, config, resume, out, overrides, device, dtype, progress) -> None:
    """Train a model from a JSON recipe (a path, or a name under configs/ such as digits_unet)."""
    from ...train.recipes import train_from_config

    values = _parse_overrides(overrides)
    if dtype == "float16":
        refuse_dtype(torch.float16, "train", "float16 training needs loss scaling (its gradients underflow), which "
                                            "the trainer does not do (--dtype bfloat16 trains in mixed precision)")
    if dtype == "bfloat16":
        if "autocast" in values and values["autocast"] != "bfloat16":
            raise click.BadParameter(f"--dtype bfloat16 and --set autocast={values['autocast']} disagree",
                                     param_hint="--dtype")
        values["autocast"] = "bfloat16"
    if out is not None:
        check_out(out)
    # Under a launcher: join the process group (the trainer takes it as sd.distributed.current()); rank 0 speaks.
    dist, started = begin(click_ctx, "train", device, ignore=("progress",))
    try:
        result = _run(train_from_config, config, resume, out, values, rank_device(dist, device),
                      progress and dist.is_main)
    finally:
        end(started)
    if dist.is_main:
        click.echo(f"trained {result.step} steps; final model in {result.final_dir}")


def _run(train_from_config, config, resume, out, values, device, progress):
    """``train_from_config`` with its errors turned into click errors that name the option."""
    kwargs = {}
    if "device" in inspect.signature(train_from_config).parameters:
        kwargs["device"] = device
    elif device.type != "cpu":
        raise click.BadParameter(f"{device}: recipes train on cpu only here (steerdiff.train.train_from_config takes "
                                 "no device)", param_hint="--device")
    try:
        return train_from_config(config, resume=resume, out_dir=out, progress=progress, overrides=values, **kwargs)
    except FileNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="CONFIG") from err
    except ValueError as err:  # a bad recipe or --set value: the message names the field
        raise click.ClickException(str(err)) from err
    except FileExistsError as err:
        raise click.UsageError(f"{err} (pass --resume to continue it)") from err


def _field_types() -> dict[str, object]:
    """The training config's field types (``TrainConfig``), to check ``--set`` values before anything runs."""
    from ...train.trainer import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    return {f.name: hints.get(f.name) for f in dataclasses.fields(TrainConfig)}


def _accepts(tp, value) -> bool:
    """Whether a JSON value fits a field type: int, float (any finite number), str, bool, Optional, tuple/list."""
    if tp is None or tp is typing.Any:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    if origin in (tuple, list):
        if not isinstance(value, list):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_accepts(a, v) for a, v in zip(args, value, strict=True))
        return all(_accepts(args[0], v) for v in value) if args else True
    return True


def _type_name(tp) -> str:
    names = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false",
             type(None): "null"}
    args = typing.get_args(tp)
    if args and typing.get_origin(tp) not in (tuple, list):
        return " or ".join(_type_name(a) for a in args)
    if typing.get_origin(tp) in (tuple, list):
        return f"a JSON list such as {json.dumps([0.9, 0.999])}" if args else "a JSON list"
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _parse_overrides(items: tuple[str, ...]) -> dict:
    """``("steps=2000", "lr=1e-3")`` -> ``{"steps": 2000, "lr": 0.001}`` (values parsed as JSON where they parse),
    each checked against the type of its training-config field (an unknown field is left to the recipe's check,
    which lists the known ones)."""
    values = {}
    types = _field_types()
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key in types and not _accepts(types[key], value):
            raise click.BadParameter(f"{key} must be {_type_name(types[key])}, got {raw!r}", param_hint="--set")
        values[key] = value
    return values
