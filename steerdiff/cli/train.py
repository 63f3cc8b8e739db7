"""``steerdiff train``: train a model from a JSON recipe with the generic loop (checkpoints, resume, final model).

    steerdiff train digits_unet
    steerdiff train configs/digits_unet.json --set steps=2000 --set lr=1e-3 --out runs/digits
    steerdiff train digits_unet --resume

The recipe's ``train`` section can be overridden field by field with ``--set``; the run directory holds the
checkpoints, the log and the final model.
"""

from __future__ import annotations

import json

import click


@click.command("train")
@click.argument("config")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in the run directory.")
@click.option("--out", default=None, help="Run directory (default: the recipe's out_dir).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a field of the recipe's train section, e.g. --set steps=2000 (VALUE is read as JSON: "
                   "numbers, true/false, null; anything else is a string). Repeatable.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def train_cmd(config, resume, out, overrides, progress) -> None:
    """Train a model from a JSON recipe (a path, or a name under configs/ such as digits_unet)."""
    from ..train.recipes import train_from_config

    values = _parse_overrides(overrides)
    try:
        result = train_from_config(config, resume=resume, out_dir=out, progress=progress, overrides=values)
    except FileNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="CONFIG") from err
    except ValueError as err:  # a bad recipe or --set value: the message names the field
        raise click.ClickException(str(err)) from err
    except FileExistsError as err:
        raise click.UsageError(f"{err} (pass --resume to continue it)") from err
    click.echo(f"trained {result.step} steps; final model in {result.final_dir}")


def _parse_overrides(items: tuple[str, ...]) -> dict:
    """``("steps=2000", "lr=1e-3")`` -> ``{"steps": 2000, "lr": 0.001}`` (values parsed as JSON where they parse)."""
    values = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            values[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip()] = raw
    return values
