"""``steerdiff demo``: an HTML report of every landed steering method beside its baselines, on the shipped models
(the experiments live in :mod:`steerdiff.app.demo`).

    steerdiff demo                      # the full report in out/demo (a few minutes on 2 cores)
    steerdiff demo --quick --out /tmp/d # the reduced run (well under a minute)
    steerdiff demo --only guidance,inverse

Writes ``index.html`` (open it in a browser; no network needed), ``results.json`` (every number on the page) and
``img/`` to ``--out``, atomically: a failed run leaves the previous report, or nothing, in place.
"""

from __future__ import annotations

import inspect
import signal
import sys
import threading

import click

from ._common import SEED, device_option, dtype_refused, progress_option


def _split(_ctx, _param, value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    keys = tuple(k.strip() for k in value.split(",") if k.strip())
    if not keys:
        raise click.BadParameter("give one or more section names separated by commas", param_hint="--only")
    return keys


@click.command("demo")
@click.option("--out", default="out/demo", show_default=True,
              help="Output directory (created; an earlier demo report there is replaced).")
@click.option("--quick", is_flag=True, help="Reduced configuration (CI): fewer samples and steps, noisier numbers.")
@click.option("--only", callback=_split, default=None,
              help="Comma-separated sections to run (guidance, align, inverse, ...); default all.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Base seed: same seed, same numbers.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="threads of torch and of the BLAS and OpenMP pools (1: identical numbers on any machine).")
@device_option
@dtype_refused("demo", "the demo checks every method's reference configuration against pass criteria set in float32 "
                       "(sample, align, restore, forecast, stylize and constrain sample take --dtype)")
@progress_option(help="One progress bar per section [default: on when stderr is a terminal].")
def demo_cmd(out: str, quick: bool, only: tuple[str, ...], seed: int, threads: int, device, progress: bool) -> None:
    """Run each landed method beside its baselines on the shipped models; write an HTML report to --out."""
    from ..demo import DemoError, run_demo

    kwargs = {}
    if "device" in inspect.signature(run_demo).parameters:
        kwargs["device"] = device
    elif device.type != "cpu":
        raise click.BadParameter(f"{device}: the demo runs on cpu only (steerdiff.app.demo.run_demo takes no device)",
                                 param_hint="--device")

    command = "steerdiff demo" + (" --quick" if quick else "") + (f" --out {out}" if out != "out/demo" else "")
    command += (f" --only {','.join(only)}" if only else "") + (f" --seed {seed}" if seed else "")
    # A terminated run (SIGTERM) unwinds like Ctrl-C, so the temporary report directory is removed.
    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum)) if main_thread else None
    try:
        results = run_demo(out, quick=quick, only=only or None, seed=seed, threads=threads, progress=progress,
                           command=command, **kwargs)
    except DemoError as err:
        param = str(err).split(":", 1)[0] if str(err).startswith("--") else None
        raise click.BadParameter(str(err).split(": ", 1)[-1], param_hint=param) from err
    except OSError as err:
        raise click.ClickException(f"cannot write the report to {out}: {err}") from err
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    for s in results["sections"]:
        state = f"{s['seconds']:.1f} s" if s["status"] == "ok" else s["note"]
        click.echo(f"{s['key']:>12}: {state}")
    click.echo(f"wrote {out}/index.html and {out}/results.json in {results['meta']['total_s']:.1f} s")

