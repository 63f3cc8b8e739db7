"""First runs answer in seconds and speak while they work (issue 35): ``sample``'s default is a grid of 16, and every
command that can take more than a few seconds shows progress bars by default when stderr is a terminal (and only
then: pipes, logs and CliRunner stay clean)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from click.testing import CliRunner

from steerdiff.app.cli import main

ROOT = Path(__file__).resolve().parents[2]
LONG = ["align", "constrain train", "demo", "forecast", "geometry", "quantize", "restore", "sample", "stylize", "train"]


def test_sample_default_is_a_grid_of_16(tmp_path):
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--steps", "4", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert metrics["n"] == 16


def _command(name: str):
    cmd = main
    for word in name.split():
        cmd = cmd.commands[word]
    return cmd


@pytest.mark.parametrize("name", LONG)
def test_progress_follows_the_terminal_by_default(name, monkeypatch):
    params = [p for p in _command(name).params if p.name == "progress"]
    assert len(params) == 1, name
    param = params[0]
    assert param.default is None and "terminal" in param.help, (name, param.default, param.help)

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    for tty in (True, False):
        monkeypatch.setattr(sys, "stderr", Stream(tty))
        assert param.callback(None, param, None) is tty, (name, tty)  # what click passes when the flag is absent
        assert param.callback(None, param, True) is True and param.callback(None, param, False) is False


def test_restore_on_a_terminal_draws_a_bar_without_being_asked(tmp_path):
    """Run in a pseudo-terminal (stderr is a tty): the bar appears with no --progress; in a pipe it does not."""
    args = [sys.executable, "-m", "steerdiff.app.cli", "restore", "--model", "digits", "--task", "inpaint-center",
            "--method", "dps", "--input", "digits:test:0", "--chains", "2", "--steps", "3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    try:
        proc = subprocess.run([*args, "--out", str(tmp_path / "tty")], stdout=subprocess.PIPE, stderr=slave,
                              env=env, timeout=300, cwd=tmp_path)
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
    assert proc.returncode == 0
    tty_err = b"".join(chunks).decode(errors="replace")
    assert "it/s" in tty_err or "s/it" in tty_err, tty_err[-2000:]
    piped = subprocess.run([*args, "--out", str(tmp_path / "pipe")], capture_output=True, text=True, env=env,
                           timeout=300, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr[-2000:]
    assert "it/s" not in piped.stderr and "s/it" not in piped.stderr, piped.stderr[-2000:]


def test_pipeline_commands_do_not_print_backend_notices_the_user_cannot_act_on(tmp_path):
    """transformers' "requires torchvision" and diffusers' "`accelerate` was not found" notices are dropped from a
    pipeline command's output; the command's own output and errors are not."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "steerdiff.app.cli", "sample", "--pipeline", "shapes_pipeline",
                           "--prompt", "a red square on a grey background", "--steps", "2", "--n", "1",
                           "--no-progress", "--out", str(tmp_path / "p")], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torchvision" not in proc.stderr and "accelerate" not in proc.stderr, proc.stderr[-2000:]
    # --no-progress (and a pipe, by default) also silences diffusers' and transformers' loading bars.
    assert "Loading pipeline components" not in proc.stderr and "Loading weights" not in proc.stderr, proc.stderr
    assert (tmp_path / "p" / "samples.png").exists()


def test_every_long_readme_example_states_its_time():
    """Each README example that runs a model for more than a moment (sample, align, restore, quantize, forecast,
    train, the pipeline commands) is followed, within its sentence, by the time it took here ("about N s")."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    flat = re.sub(r"\s*\n\s*", " ", text)
    spans = re.finditer(r"`(steerdiff (?:sample|align|restore|quantize|forecast|train) [^`]*)`([^`]{0,120})", flat)
    missing = [m.group(1) for m in spans if re.search(r"--model|--pipeline|configs/", m.group(1))
               and not re.search(r"about \d+(\.\d+)? (s|min)\b", m.group(2))]
    assert missing == [], missing


@pytest.mark.slow
def test_readme_composition_example_does_what_its_sentence_says(tmp_path):
    """The README's composition example at the sentence's sample size: the conformity it states is the one measured,
    and "none is red" holds under the shipped shapes classifier (about 80 s on 2 CPU cores)."""
    text = re.sub(r"\s*\n\s*", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    example = re.search(r'`steerdiff sample --model shapes_coind --expr "([^"]+)" --scale ([0-9.]+)`([^`]*)', text)
    assert example, "the README's composition example"
    claim = re.search(r"conformity ([0-9.]+) over (\d+) samples: none is red", example.group(3))
    assert claim, example.group(3)
    out = tmp_path / "coind"
    res = CliRunner().invoke(main, ["sample", "--model", "shapes_coind", "--expr", example.group(1), "--scale",
                                    example.group(2), "--n", claim.group(2), "--no-progress", "--out", str(out)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert round(metrics["conformity"], 2) == float(claim.group(1))

    from safetensors.torch import load_file

    from steerdiff.models.io import load

    pred = load("shapes_classifier").predict(load_file(out / "samples.safetensors")["samples"].clamp(-1, 1))
    red = metrics["guidance"]["attributes"]["colour"].index("red")
    assert (pred[:, 1] != red).all()
