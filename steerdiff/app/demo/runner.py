"""Run the demo sections and write the report into place atomically (``steerdiff demo``).

Everything is written into a temporary directory beside ``out`` and moved into place at the end, so an error or
an interrupt leaves nothing half-written. An existing ``out`` is replaced only when it is empty or holds an earlier
demo report and nothing else (its ``.steerdiff-checkpoint`` marker lists every file in it; a report from before the
marker: ``results.json`` says so and it holds only ``index.html``, ``results.json`` and ``img/``); anything else is
refused, so no user file is lost. Nothing is written inside the installed package (docs/methods/conventions.md,
"Errors").
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ...io import MARKER_NAME, replace_refusal, write_marker
from .registry import SectionUnavailable, all_sections
from .report import FORMAT_VERSION, GENERATOR, SectionResult, render_html, write_json, write_text_atomic


class DemoError(ValueError):
    """Bad input to the demo (an unknown section, an unusable output directory); names the argument."""


@dataclass
class DemoContext:
    """What a section needs to run and to write its images.

    Attributes:
        root: directory the report is being written to (temporary until the run ends).
        quick: the reduced configuration (CI: the whole demo in well under a minute).
        seed: base seed; every random draw of every section is derived from it.
        progress: show one progress bar per section.
        section: key of the running section (its images go to ``img/<section>/``).
    """

    root: Path
    quick: bool = False
    seed: int = 0
    progress: bool = True
    section: str = ""
    _bars: list = field(default_factory=list, repr=False)

    def path(self, name: str) -> tuple[Path, str]:
        """``(absolute path, path relative to the report)`` for a file ``name`` of the running section."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"name must be a plain file name, got {name!r}")
        rel = f"img/{self.section}/{name}"
        full = self.root / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        return full, rel

    def grid(self, images: torch.Tensor, name: str, nrow: int | None = None, scale: int = 4) -> str:
        """Save ``[N, C, H, W]`` images in [-1, 1] as one PNG grid ``name``; returns its relative path."""
        from ...viz import image_grid

        full, rel = self.path(name)
        image_grid(images, full, nrow=nrow, scale=scale)
        return rel

    def plot(self, fig, name: str) -> str:
        """Save a matplotlib figure as PNG ``name`` and close it; returns its relative path."""
        import matplotlib.pyplot as plt

        full, rel = self.path(name)
        fig.savefig(full, dpi=100)
        plt.close(fig)
        return rel

    def bar(self, total: int, desc: str):
        """The section's progress bar (one per experiment; ``update(1)`` after each run)."""
        bar = tqdm(total=total, desc=desc, disable=not self.progress, leave=True, dynamic_ncols=True)
        self._bars.append(bar)
        return bar


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DemoError(f"--out: {out} exists and is not a directory")
    why = replace_refusal(out, what="demo report")
    if why is not None and not _earlier_report(out):
        raise DemoError(f"--out: refusing to write there: {why}")
    parent = out.parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise DemoError(f"--out: cannot write under {probe} (not a writable directory)")
    if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        raise DemoError(f"--out: {out} is not writable")


def _earlier_report(out: Path) -> bool:
    """A report written before the marker: ``results.json`` says so, and it holds nothing but what the demo writes
    (``index.html``, ``results.json``, PNGs under ``img/``)."""
    if not out.is_dir() or (out / MARKER_NAME).exists():
        return False
    try:
        if json.loads((out / "results.json").read_text()).get("generator") != GENERATOR:
            return False
    except (OSError, ValueError, AttributeError):
        return False
    for p in out.rglob("*"):
        rel = p.relative_to(out)
        if p.is_symlink():
            return False
        if rel.as_posix() in ("index.html", "results.json"):
            continue
        if rel.parts[0] == "img" and (p.is_dir() or p.suffix == ".png"):
            continue
        return False
    return True


def select_sections(only: Sequence[str] | str | None):
    """The sections to report, in order; ``only`` restricts to some keys, given as a sequence or as one
    comma-separated string like ``--only`` (unknown keys raise :class:`DemoError`)."""
    specs = all_sections()
    if isinstance(only, str):  # a string is a sequence too: without this it would be read letter by letter
        only = [key.strip() for key in only.split(",") if key.strip()]
    if only:
        known = [s.key for s in specs]
        unknown = [k for k in only if k not in known]
        if unknown:
            raise DemoError(f"--only: unknown section(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        specs = [s for s in specs if s.key in only]
    return specs


def run_demo(out: str | Path, quick: bool = False, only: Sequence[str] | str | None = None, seed: int = 0,
             threads: int = 1, progress: bool = True, command: str | None = None) -> dict:
    """Run the demo and write ``index.html``, ``results.json`` and ``img/`` to ``out``.

    Args:
        out: output directory (created; replaced if it holds an earlier demo report).
        quick: the reduced configuration.
        only: section keys to run, a sequence or one comma-separated string (default: all).
        seed: base seed (same seed, same numbers).
        threads: threads of torch's pool and of the BLAS and OpenMP pools of numpy, scipy and scikit-learn during
            the run (1 keeps results identical across machines' core counts).
        progress: one progress bar per section on stderr.
        command: the command line shown on the page (default: this process's argv).

    Returns:
        The results dictionary written to ``results.json``.
    """
    if not isinstance(threads, int) or threads < 1:
        raise DemoError(f"--threads must be a positive integer, got {threads!r}")
    out = Path(out).expanduser().absolute()
    _check_out(out)
    specs = select_sections(only)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the report is an ordinary directory
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    start, cpu_start = time.perf_counter(), time.process_time()
    native = None
    try:
        native = _limit_native_threads(threads)
        ctx = DemoContext(root=tmp, quick=quick, seed=seed, progress=progress)
        sections = []
        for spec in specs:
            if spec.note:
                sections.append(SectionResult(spec.key, spec.title, status="unavailable", note=spec.note).to_dict())
                if progress:
                    tqdm.write(f"{spec.key}: {spec.note}", file=sys.stderr)
                continue
            ctx.section = spec.key
            t, cpu = time.perf_counter(), time.process_time()
            try:
                result = spec.run(ctx)
            except SectionUnavailable as err:
                note = f"not available: {err}"
                sections.append(SectionResult(spec.key, spec.title, status="unavailable", note=note).to_dict())
                shutil.rmtree(tmp / "img" / spec.key, ignore_errors=True)
                if progress:
                    tqdm.write(f"{spec.key}: {note}", file=sys.stderr)
                continue
            finally:
                for bar in ctx._bars:
                    bar.close()
                ctx._bars.clear()
            if not isinstance(result, SectionResult):
                raise TypeError(f"demo section {spec.key!r} returned {type(result).__name__}, not a SectionResult")
            result.key, result.title = spec.key, spec.title
            result.seconds = time.perf_counter() - t
            result.cpu_seconds = time.process_time() - cpu
            sections.append(result.to_dict())
        results = {
            "generator": GENERATOR, "format_version": FORMAT_VERSION,
            "meta": {"command": command or shlex.join(["steerdiff", *sys.argv[1:]]), "quick": quick, "seed": seed,
                     "threads": threads, "torch": torch.__version__, "steerdiff": _version(),
                     "python": platform.python_version(), "machine": platform.machine(),
                     "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                     "total_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu_start},
            "sections": sections,
        }
        write_json(results, tmp / "results.json")
        write_text_atomic(tmp / "index.html", render_html(results))
        write_marker(tmp)  # lists every file: a later run may replace this report, and nothing a user adds to it
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if native is not None:
            native.restore_original_limits()
        torch.set_num_threads(old_threads)
    return results


def _limit_native_threads(threads: int) -> threadpool_limits:
    """Cap the BLAS and OpenMP pools of numpy, scipy and scikit-learn at ``threads`` for the run.

    ``torch.set_num_threads`` reaches only torch's own pool. The others default to one thread a core, and OpenBLAS's
    idle threads spin: on a 2-core machine that cost the quick run about 5 s of CPU on small matrices, with no gain
    in wall time. A pool is capped only once its library is loaded, so the libraries the sections use are loaded
    first.
    """
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS)
    import sklearn  # noqa: F401  (loads scikit-learn's OpenMP runtime)

    return threadpool_limits(limits=threads)


def _move_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.rename(out, old / "report")
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old / "report", out)  # put the earlier report back
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("steerdiff")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout)
        return "unknown"
