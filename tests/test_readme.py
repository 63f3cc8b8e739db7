"""Every ``steerdiff ...`` command the README shows runs as written and writes what it promises.

Commands are taken from fenced code blocks (lines that start with ``steerdiff``) and from inline code spans (which
may wrap across lines), then run in README order through click's CliRunner in a fresh directory (so ``--out out/x``
lands there and a command can use what an earlier one wrote). By default each command gets size-capping options
appended (click keeps the last value of an option, and ``--set`` the last value of a key), so the whole file runs in
well under a minute; ``STEERDIFF_README_FULL=1`` runs them at the README's sizes (many minutes).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from steerdiff.app.cli import main
from steerdiff.app.cli.sample_graph import graph_model_dir

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FULL = os.environ.get("STEERDIFF_README_FULL") == "1"

# Appended per subcommand unless STEERDIFF_README_FULL=1: the smallest sizes that still run every code path.
CAPS = {
    "sample": ["--n", "4", "--steps", "3", "--no-progress"],
    "align": ["--n", "2", "--particles", "2", "--steps", "3", "--no-progress"],
    "restore": ["--chains", "2", "--steps", "3", "--no-progress"],
    "quantize": ["--rank", "2", "--num-samples", "4", "--num-grids", "2", "--num-iters", "1"],
    "train": ["--set", "steps=2", "--set", "batch_size=8", "--set", "warmup_steps=1", "--set", "checkpoint_every=1",
              "--no-progress"],
    "demo": ["--quick", "--only", "constrain", "--no-progress"],
}
DEFAULT_OUT = {"sample": "out", "align": "out", "restore": "out", "demo": "out/demo"}
# What each command promises to write into its --out directory (the module docstrings and the README).
PROMISED = {
    "sample": ["samples.png", "metrics.json"],
    "align": ["samples.png", "metrics.json"],
    "restore": ["restored.png", "samples.safetensors", "metrics.json"],
    "quantize": ["config.json", "model.safetensors", "quantization.json"],
    "demo": ["index.html", "results.json"],
    "motion": ["motion_0.bvh", "features.safetensors", "metrics.json"],
    "segment": ["procedural_0000_mask.png", "procedural_0000_edge.png", "metrics.json"],
}
# `sample --model <a graph model>` writes graphs, not images (steerdiff/app/cli/sample_graph.py)
PROMISED_GRAPH_SAMPLE = ["graphs.json", "graphs.png", "metrics.json"]


def readme_commands(text: str) -> list[str]:
    """The ``steerdiff ...`` commands of a markdown text, in order, from fenced blocks and inline code spans."""
    commands: list[tuple[int, str]] = []
    prose = []
    fenced = False
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            prose.append("\n")
        elif fenced:
            body = line.strip().removeprefix("$ ")
            if body.startswith("steerdiff "):
                commands.append((offset, body.split(" #")[0].strip()))
            else:  # a comment in a code block may quote a command in backticks
                commands += [(offset, m) for m in re.findall(r"`(steerdiff [^`]+)`", line)]
            prose.append("\n")
        else:
            prose.append(line)
        offset += len(line)
    # Inline spans over the prose with its line structure kept, so a span that wraps a line is one command.
    joined = "".join(prose)
    for m in re.finditer(r"`([^`]+)`", joined):
        span = " ".join(m.group(1).split())
        if span.startswith("steerdiff "):
            commands.append((m.start(), span))
    return [c for _, c in sorted(commands, key=lambda item: item[0])]


def _option(args: list[str], name: str) -> str | None:
    """The last value of ``name`` in ``args`` (what click uses)."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    return values[-1] if values else None


def test_extraction_finds_the_readme_commands():
    text = README.read_text()
    commands = readme_commands(text)
    assert commands, "no steerdiff command found in README.md"
    # Cross-check with a plain count of spans and lines that start a command (independent of the pairing logic).
    blocks = "".join(re.findall(r"```.*?```", text, flags=re.S))
    starts = len(re.findall(r"`steerdiff ", text)) + len(re.findall(r"(?m)^\s*(?:\$ )?steerdiff ", blocks))
    assert len(commands) == starts, (len(commands), starts, commands)
    # A span that wraps a line is read as one command.
    wrapped = readme_commands("text `steerdiff sample --model\n  digits --n 4` more\n```\nsteerdiff demo  # x\n```\n")
    assert wrapped == ["steerdiff sample --model digits --n 4", "steerdiff demo"]


def test_every_readme_command_runs_as_written(tmp_path, monkeypatch):
    (tmp_path / "configs").symlink_to(ROOT / "configs", target_is_directory=True)  # README paths are repo-relative
    monkeypatch.chdir(tmp_path)
    failures = []
    for command in readme_commands(README.read_text()):
        args = shlex.split(command)[1:]
        sub = args[0] if args else ""
        run = args + ([] if FULL or "--help" in args else CAPS.get(sub, []))
        res = CliRunner().invoke(main, run)
        if res.exit_code != 0:
            tail = res.output.strip().splitlines()[-3:]
            failures.append(f"{command!r} (run as {shlex.join(run)!r}): exit {res.exit_code}, "
                            f"{type(res.exception).__name__}: {' | '.join(tail)}")
            continue
        if "--help" in args:
            if "Usage:" not in res.output:
                failures.append(f"{command!r}: --help printed no usage")
            continue
        if sub == "train":
            recipe = json.loads(Path(args[1]).read_text())
            out = Path(_option(run, "--out") or recipe["out_dir"])
            promised = [out / "final" / "model.safetensors", out / "train_log.json"]
        else:
            out = Path(_option(run, "--out") or DEFAULT_OUT.get(sub, "out"))
            names = PROMISED.get(sub, [])
            if sub == "sample" and graph_model_dir(_option(run, "--model") or "") is not None:
                names = PROMISED_GRAPH_SAMPLE
            promised = [out / name for name in names]
        missing = [str(p) for p in promised if not p.is_file()]
        if missing:
            failures.append(f"{command!r}: exit 0 but did not write {missing}")
    assert not failures, "README commands that do not run as written:\n" + "\n".join(failures)


def _python_block_after(text: str, heading: str) -> str:
    """The first fenced ``python`` block after the line ``heading``."""
    rest = text[text.index(heading):]
    m = re.search(r"```python\n(.*?)```", rest, flags=re.S)
    assert m, f"no python block after {heading!r}"
    return m.group(1)


def test_the_real_models_example_runs_as_written(tmp_path, monkeypatch):
    """The five-line example that opens "Real models" runs on the shipped pipeline as written and does what its
    comments say: a PIL image saved, NFE 60 under CFG at 30 steps, APG images [1, 3, H, W] in [0, 1]."""
    import pytest

    pytest.importorskip("diffusers")
    from steerdiff.pipelines import shipped_pipelines

    if "shapes_pipeline" not in shipped_pipelines():
        pytest.skip("shipped pipeline not built")
    code = _python_block_after(README.read_text(), "## Real models")
    assert len(code.strip().splitlines()) == 5
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    assert (tmp_path / "square.png").is_file() and scope["out"].nfe == 60
    images = scope["apg"].images
    assert images.shape[:2] == (1, 3) and float(images.min()) >= 0 and float(images.max()) <= 1
