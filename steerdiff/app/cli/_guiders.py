"""``sample --guidance``: the guiders offered and the options each takes, read from the guider registry.

A guider is built as ``cls(scale, **options)`` (:func:`steerdiff.guidance.build_guider`); which of the command's
guider flags it takes is read from its constructor's signature, so a guider registered anywhere (a plugin
included) is offered by ``--guidance`` and gets ``--phi``, ``--eta``, ... exactly when its constructor has a
parameter of that name. A parameter the command has no flag for keeps the guider's default; a guider that needs one
(a parameter without a default) is not offered. A flag given for a guider that does not take it, or where no guider
runs (``--scale 1``, ``--expr``), is an error naming the flag. Methods: docs/methods/guidance.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import click

from ...guidance import GUIDERS, SPACES, Guider, build_guider
from ._common import FINITE, RegistryChoice, cli_spelling, finite_range

# The command's guider flags: option name -> (type, what it sets). The guiders that take each are read from the
# registry when the help is built; the default is the guider's own.
GUIDER_FLAGS: dict[str, tuple[click.ParamType, str]] = {
    "eta": (finite_range(0, 1), "weight of the update's component parallel to D_c (APG: 1 with no clamp or momentum "
                                "is CFG)"),
    "momentum": (FINITE, "momentum beta, |beta| < 1 (APG)"),
    "r_rms": (finite_range(min=0), "clamp of the update's norm per element RMS, r = r_rms * sqrt(d) (APG; default: "
                                   "no clamp)"),
    "phi": (finite_range(0, 1), "rescale mix (CFG-rescale; 0 is plain CFG)"),
    "space": (click.Choice(list(SPACES)), "prediction space the guider combines in: D (x0), eps or v (flow "
                                          "velocity); docs/methods/guidance.md 'Prediction spaces'"),
    "zero_init_steps": (click.IntRange(min=0), "first steps returning the zero prediction (CFG-Zero*)"),
    "alpha": (finite_range(min=0), "damping strength of the magnitude-aware weight (MAMBO-G)"),
    "low_scale": (finite_range(min=0), "w of the lowest-frequency band; --scale is the highest band's (FDG)"),
    "levels": (click.IntRange(min=2), "number of Laplacian-pyramid bands (FDG)"),
    "parallel_weight": (finite_range(0, 1), "weight of each band's update parallel to the conditional band (FDG)"),
    "pag_scale": (finite_range(min=0), "weight of D_c - D_perturbed (PAG; --scale is CFG's w, 1: PAG alone)"),
    "weak": (click.STRING, "the weak model, a shipped name or checkpoint directory (AutoGuidance; digits: "
                           "digits_weak, shapes: shapes_weak)"),
    "layers": (click.STRING, "comma-separated layer ids: regular expressions over module names of the "
                             "self-attention layers to perturb (PAG, SEG; e.g. mid or down_blocks.2,up), of the "
                             "attention layers to guide (NAG; default all), or block indices / names of the "
                             "transformer blocks to skip (SLG; e.g. 7,8,9)"),
    "slg_scale": (finite_range(min=0), "weight of D_c - D_skipped (SLG; diffusers' skip_layer_guidance_scale)"),
    "perturb_start": (finite_range(0, 1), "SLG window start: the term is on at steps i > N * start (diffusers' "
                                          "skip_layer_guidance_start)"),
    "perturb_stop": (finite_range(0, 1), "SLG window stop: the term is on at steps i < N * stop (diffusers' "
                                         "skip_layer_guidance_stop)"),
    "seg_scale": (finite_range(min=0), "weight of D_c - D_blurred (SEG)"),
    "seg_blur_sigma": (click.FloatRange(min=0, min_open=True), "std of SEG's query blur in tokens (inf: the mean)"),
    "nag_tau": (finite_range(min=1), "clip of the L1-norm ratio |Z|/|Z+| of NAG's extrapolated attention features "
                                     "(NAG; --scale is its phi = nag_scale, 1: off)"),
    "nag_alpha": (finite_range(0, 1), "blend of NAG's normalised features with the positive ones (NAG)"),
}


def guider_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The options of a guider class: its constructor's named parameters after the scale."""
    params = [p for p in inspect.signature(cls).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return {p.name: p for p in params[1:]}


def offered(_name: str, cls: type) -> bool:
    """Whether ``sample`` can build this guider: every parameter without a default is one of its flags."""
    try:
        params = guider_parameters(cls)
    except (TypeError, ValueError):  # no signature to read: the command cannot tell what it needs
        return False
    return all(p.default is not p.empty or name in GUIDER_FLAGS for name, p in params.items())


GUIDANCE_CHOICE = RegistryChoice(GUIDERS, offered)


def _takers(option: str) -> str:
    names = []
    for name, cls in GUIDERS.items():
        if offered(name, cls) and option in guider_parameters(cls):
            default = guider_parameters(cls)[option].default
            shown = "" if default is inspect.Parameter.empty else f" (default {default})"
            names.append(f"{cli_spelling(GUIDERS, name)}{shown}")
    return ", ".join(names) or "none registered"


class GuiderFlag(click.Option):
    """A guider flag whose help lists the guiders that take it, read from the registry when the help is shown."""

    def __init__(self, *args, text: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.text = text

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = f"Guider option {self.name}: {self.text}. Taken by: {_takers(self.name)}."
        return super().get_help_record(ctx)


def guider_flag_options(func: Callable) -> Callable:
    """The guider flags as click options (default: not given), each saying which guiders take it."""
    for option in reversed(GUIDER_FLAGS):
        kind, text = GUIDER_FLAGS[option]
        func = click.option(f"--{option.replace('_', '-')}", option, cls=GuiderFlag, type=kind, default=None,
                            text=text)(func)
    return func


def _given(ctx: click.Context, option: str) -> bool:
    return ctx.get_parameter_source(option) not in (None, click.core.ParameterSource.DEFAULT)


def given_flags(ctx: click.Context) -> list[str]:
    """The guider flags given on the command line."""
    return [option for option in GUIDER_FLAGS if _given(ctx, option)]


def refuse_flags(ctx: click.Context, why: str) -> None:
    """An error naming the first guider flag given, where no guider runs (``why`` says so)."""
    for option in given_flags(ctx):
        raise click.BadParameter(why, param_hint=f"--{option.replace('_', '-')}")


def build(ctx: click.Context, name: str, scale: float) -> Guider:
    """The guider ``--guidance name`` at ``scale`` with the guider flags given (the others keep its defaults).

    Raises:
        click.BadParameter: a flag the guider does not take (named, with those it takes), or a value it refuses.
    """
    cls = GUIDERS.get(name)
    params = guider_parameters(cls)
    options = {}
    for option in given_flags(ctx):
        flag = f"--{option.replace('_', '-')}"
        if option not in params:
            takes = [f"--{o.replace('_', '-')}" for o in GUIDER_FLAGS if o in params]
            raise click.BadParameter(f"{flag} does not apply to --guidance {name} (it takes "
                                     f"{', '.join(takes) if takes else 'none of the guider flags'})",
                                     param_hint=flag)
        options[option] = ctx.params[option]
    try:
        return build_guider(name, scale, **options)
    except (TypeError, ValueError) as err:
        raise click.BadParameter(str(err), param_hint="--guidance options") from err
