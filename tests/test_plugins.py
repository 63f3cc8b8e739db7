"""Plugins reach the command line: a user's module named in ``STEERDIFF_PLUGINS`` or declared under the
``steerdiff.plugins`` entry points registers entries that ``steerdiff`` offers (``--help``) and runs.

The plugin module is assembled from :data:`PARTS`, one entry per kind of plug-in: the code that registers it, the
command whose ``--help`` must offer its name, a run that uses it, and a check of that run against a computation made
here (guider, sampler, inverse solver, inverse task, aligner, quantizer): a new kind is one more entry. A pipeline
family needs a pipeline directory built first, so it has its own test
(:func:`test_a_pipeline_family_plugin_reaches_the_command_line`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Part:
    """One plug-in kind: ``code`` (module-level code registering ``name``; :data:`HEADER`'s imports are in scope and
    it may import more), the subcommand whose ``--help`` offers ``name``, the arguments of a run that uses it, and
    ``check(out_dir, tmp_path)`` of that run (against a computation made in the test)."""

    kind: str
    name: str
    code: str
    command: str
    run: list[str]
    check: object


HEADER = """\
import torch
from steerdiff.align import AlignResult, register_aligner
from steerdiff.core import denoise_checked, register_sampler
from steerdiff.guidance import CFG, register_guider
from steerdiff.inverse import Downsample, register_solver, register_task
from steerdiff.quant import QuantJob, W8A8Layer, register_quantizer
"""

MIXTURE_RUN = ["sample", "--model", "gmm2d", "--class", "2", "--n", "6", "--seed", "3", "--sigma-max", "2",
               "--no-progress"]


def _samples(out: Path) -> torch.Tensor:
    return load_file(out / "samples.safetensors")["samples"]


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def _check_guider(out: Path, tmp_path: Path) -> None:
    """The plugin guider is CFG times its ``factor`` (default 0.5, which no flag sets): one Euler step to sigma 0
    lands on the guided D, so the samples are half of plain CFG's (run here in-process, without the plugin)."""
    from click.testing import CliRunner

    from steerdiff.app.cli import main

    ref = tmp_path / "cfg-ref"
    res = CliRunner().invoke(main, [*MIXTURE_RUN, "--steps", "1", "--method", "euler", "--scale", "3",
                                    "--out", str(ref)])
    assert res.exit_code == 0, res.output
    got, cfg = _samples(out), _samples(ref)
    assert torch.allclose(got, 0.5 * cfg, rtol=0, atol=1e-12) and not torch.allclose(got, cfg)
    assert _metrics(out)["guidance"] == {**_metrics(ref)["guidance"], "name": "plugin-guider", "factor": 0.5}


def _check_sampler(out: Path, tmp_path: Path) -> None:
    """The plugin sampler jumps to D(x_T, sigma_max) with one evaluation whatever --steps says: the samples of 4
    steps are those of one Euler step to sigma 0, at NFE 1."""
    from click.testing import CliRunner

    from steerdiff.app.cli import main

    ref = tmp_path / "euler-ref"
    res = CliRunner().invoke(main, [*MIXTURE_RUN, "--steps", "1", "--method", "euler", "--out", str(ref)])
    assert res.exit_code == 0, res.output
    assert _metrics(out)["nfe"] == 1 and _metrics(out)["method"] == "plugin_jump"
    assert torch.allclose(_samples(out), _samples(ref), rtol=0, atol=1e-12)


def _digit(index: int = 0) -> np.ndarray:
    from steerdiff.data.digits import load_digits

    return load_digits("test")[0][index, 0].double().numpy()


def _check_solver(out: Path, tmp_path: Path) -> None:
    """The plugin solver returns the operator's pseudo-inverse of y for every chain: for sr2 without noise, each
    2x2 block of the clean image replaced by its mean (computed here with numpy)."""
    blocks = _digit().reshape(4, 2, 4, 2).mean(axis=(1, 3))
    expected = np.repeat(np.repeat(blocks, 2, axis=0), 2, axis=1)
    samples = _samples(out)
    assert samples.shape == (2, 1, 8, 8) and _metrics(out)["method"] == "plugin_pinv"
    assert np.allclose(samples.double().numpy(), expected[None, None], atol=1e-6)


def _check_task(out: Path, tmp_path: Path) -> None:
    """The plugin task measures 4x4 block means: y of the clean image without noise, computed here with numpy."""
    y = load_file(out / "samples.safetensors")["y"]
    assert _metrics(out)["task"] == "plugin-sr4"
    assert np.allclose(y.double().numpy(), _digit().reshape(2, 4, 2, 4).mean(axis=(1, 3)).reshape(-1), atol=1e-12)


ALIGN_RUN = ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--n", "3", "--steps", "6", "--seed", "3",
             "--no-progress"]


def _check_aligner(out: Path, tmp_path: Path) -> None:
    """The plugin aligner returns, per group of 4 particles, the mean of their denoised estimates at sigmas[0] plus
    ``--offset``: computed here from the exact mixture's denoiser on the same per-sample noise."""
    import steerdiff as sd

    gmm = sd.models.builtin_mixture("gmm2d")
    noise = sd.randn((3 * 4, 2), seeds=3, dtype=torch.float64)
    s0 = float(sd.sigmas.karras(7, 0.002, 80.0)[0])
    d = gmm(noise * s0, torch.full((12,), s0, dtype=torch.float64))
    assert torch.allclose(_samples(out), d.view(3, 4, 2).mean(1) + 1.5, rtol=0, atol=1e-12)
    metrics = _metrics(out)
    assert metrics["method"] == "plugin_mean" and metrics["offset"] == 1.5


def _check_quantizer(out: Path, tmp_path: Path) -> None:
    """The plugin quantizer replaces the first layer group of the shipped digits model by W8A8 layers and leaves the
    rest float: the checkpoint records the method, and the quantized layers' tensors are W8A8Layer.from_float of the
    shipped float layers (rebuilt here, without the plugin)."""
    from steerdiff.io import load_tensors
    from steerdiff.models import load
    from steerdiff.quant import W8A8Layer

    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["method"] == "plugin_w8a8_first"
    layers = config["quantization"]["layers"]
    assert layers and all(spec["type"] == "W8A8Layer" for spec in layers.values())
    saved = load_tensors(out / "model.safetensors")
    net = load("digits")
    for path in layers:
        want = W8A8Layer.from_float(net.get_submodule(path)).state_dict()
        for key, value in want.items():
            assert torch.equal(saved[f"{path}.{key}"], value), (path, key)


RESTORE_RUN = ["restore", "--model", "digits-gmm", "--input", "digits:test:0", "--noise-std", "0", "--chains", "2",
               "--steps", "4", "--no-progress"]

PARTS = [
    Part("guider", "plugin-guider", '''
        @register_guider("plugin_guider", aliases=("plugin-guider",))
        class PluginGuider(CFG):
            def __init__(self, scale, factor=0.5, **window):
                super().__init__(scale, **window)
                self.factor = factor

            @property
            def config(self):
                return {**super().config, "factor": self.factor}

            def combine(self, d_cond, d_null, x, sigma, step=None):
                return super().combine(d_cond, d_null, x, sigma, step) * self.factor
        ''', "sample", [*MIXTURE_RUN, "--steps", "1", "--method", "euler", "--guidance", "plugin-guider",
                        "--scale", "3"], _check_guider),
    Part("sampler", "plugin_jump", '''
        @register_sampler("plugin_jump", nfe=lambda steps: 1)
        def sample_plugin_jump(model, x, sigmas, **_):
            return denoise_checked(model, x, sigmas[0], 0)
        ''', "sample", [*MIXTURE_RUN, "--steps", "4", "--method", "plugin_jump"], _check_sampler),
    Part("inverse solver", "plugin_pinv", '''
        @register_solver("plugin_pinv", defaults={}, check=lambda opts, operator: opts)
        def run_plugin_pinv(ctx, opts):
            x = ctx.operator.pinv(ctx.y_rep).reshape(ctx.rows, *ctx.operator.shape)
            return x, torch.full((ctx.rows,), -1, dtype=torch.long), 0.0
        ''', "restore", [*RESTORE_RUN, "--task", "sr2", "--method", "plugin_pinv"], _check_solver),
    Part("inverse task", "plugin-sr4", '''
        @register_task("plugin-sr4")
        def plugin_sr4(shape):
            return Downsample(4, shape)
        ''', "restore", [*RESTORE_RUN, "--task", "plugin-sr4", "--method", "dps"], _check_task),
    Part("aligner", "plugin_mean", '''
        @register_aligner("plugin_mean")
        def plugin_mean(denoiser, reward, noise, sigmas, *, particles: int = 2, cond=None, offset: float = 0.0):
            """Per group, the mean of the particles' denoised estimates at sigmas[0], plus offset."""
            s0 = float(sigmas[0])
            d = denoiser(noise * s0, torch.full((noise.shape[0],), s0, dtype=noise.dtype), cond)
            x = d.view(-1, particles, *d.shape[1:]).mean(1) + offset
            return AlignResult(samples=x, rewards=reward(x), method="plugin_mean", groups=x.shape[0],
                               particles=particles, nfe=particles, nfe_grad=0, reward_evals=1)
        ''', "align", [*ALIGN_RUN, "--method", "plugin_mean", "--particles", "4", "--offset", "1.5"],
         _check_aligner),
    Part("quantizer", "plugin_w8a8_first", '''
        @register_quantizer("plugin_w8a8_first")
        def plugin_w8a8_first(job: QuantJob) -> None:
            """W8A8 on the first layer group only."""
            for path in job.groups[0].paths:
                job.replace(path, W8A8Layer.from_float(job.layer(path)))
        ''', "quantize", ["quantize", "--model", "digits", "--method", "plugin_w8a8_first", "--num-samples", "2"],
         _check_quantizer),
]


def _env(path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "STEERDIFF_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(path), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    return env | extra


SCRIPT = Path(sys.executable).with_name("steerdiff")  # the console script, when installed beside this Python


def _cli(args: list[str], env: dict, cwd: Path, script: bool = False) -> subprocess.CompletedProcess:
    """``python -m steerdiff.app.cli ARGS`` (or, with ``script``, the ``steerdiff`` console script, whose path does
    not hold the current directory) in a fresh process."""
    argv = [str(SCRIPT)] if script else [sys.executable, "-m", "steerdiff.app.cli"]
    return subprocess.run([*argv, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def _write_plugin(directory: Path, module: str, parts: list[Part]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    body = "".join(textwrap.dedent(p.code) for p in parts)
    (directory / f"{module}.py").write_text(HEADER + body)


# One fresh process imports the command line with STEERDIFF_PLUGINS set (so the plugin loads where the steerdiff
# command loads it, before the subcommands build their options) and invokes every --help and every run of PARTS;
# one process instead of one per command keeps the test fast. The runs of the console script itself are below.
DRIVER = """
import json, sys
from click.testing import CliRunner
from steerdiff.app.cli import main
results = {}
for key, argv in json.loads(sys.argv[1]).items():
    res = CliRunner().invoke(main, argv)
    results[key] = (res.exit_code, res.output)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def plugin_runs(tmp_path_factory) -> tuple[dict, Path]:
    """``({job: (exit code, output)}, out root)`` of ``COMMAND --help`` and each part's run, with the plugin."""
    directory = tmp_path_factory.mktemp("plugins")
    _write_plugin(directory, "my_plugin", PARTS)
    jobs = {f"help:{c}": [c, "--help"] for c in sorted({p.command for p in PARTS})}
    jobs |= {f"run:{p.kind}": [*p.run, "--out", str(directory / "out" / p.kind)] for p in PARTS}
    res = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], env=_env(directory,
                         STEERDIFF_PLUGINS="my_plugin"), cwd=directory, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1]), directory / "out"


@pytest.mark.parametrize("command", sorted({p.command for p in PARTS}))
def test_help_offers_every_plugin_name(command, plugin_runs):
    code, output = plugin_runs[0][f"help:{command}"]
    assert code == 0, output
    for part in PARTS:
        if part.command == command:
            assert part.name in output, (part.kind, output)
    from click.testing import CliRunner

    from steerdiff.app.cli import main

    without = CliRunner().invoke(main, [command, "--help"])  # this process has not loaded the plugin
    assert without.exit_code == 0 and not any(p.name in without.output for p in PARTS if p.command == command)


def _contributing_example() -> tuple[str, list[str]]:
    """The worked example of CONTRIBUTING.md's "Plugins": the plugin file and the shell commands, as written."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("\n## Plugins"):]
    section = section[section.index("**Worked example"):]
    code = section[section.index("```python\n") + 10:]
    code = code[:code.index("```")]
    shell = section[section.index("```bash\n") + 8:]
    shell = shell[:shell.index("```")].replace("\\\n", " ")
    return code, [line.split("#")[0].strip() for line in shell.splitlines() if line.strip()]


@pytest.mark.skipif(not SCRIPT.is_file(), reason="the steerdiff console script is not installed beside this Python")
def test_the_contributing_example_runs_as_written(tmp_path):
    """CONTRIBUTING.md's plugin file, saved as my_plugin.py in the current directory (not on PYTHONPATH), and its
    commands run by the shell with the ``steerdiff`` console script (whose sys.path lacks the current directory):
    the help offers the guider and the sampler, and the run uses them."""
    code, commands = _contributing_example()
    (tmp_path / "my_plugin.py").write_text(code)
    env = _env(tmp_path / "elsewhere")
    env["PATH"] = os.pathsep.join([str(SCRIPT.parent), env.get("PATH", "")])
    assert len(commands) == 2 and all(c.startswith("STEERDIFF_PLUGINS=my_plugin steerdiff sample") for c in commands)
    runs = [subprocess.run(["bash", "-c", c], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
            for c in commands]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert "my-guider" in runs[0].stdout and "my_euler" in runs[0].stdout
    metrics = _metrics(tmp_path / "out")
    assert metrics["method"] == "my_euler" and metrics["nfe"] == 2 * 20  # the doubled batch of guidance
    assert {k: metrics["guidance"][k] for k in ("name", "scale", "phi")} == {"name": "my_guider", "scale": 4.0,
                                                                             "phi": 0.5}


@pytest.mark.parametrize("part", PARTS, ids=[p.kind for p in PARTS])
def test_a_run_uses_the_plugin(part, plugin_runs, tmp_path):
    code, output = plugin_runs[0][f"run:{part.kind}"]
    assert code == 0, output
    part.check(plugin_runs[1] / part.kind, tmp_path)


def _fake_distribution(directory: Path, dist: str, entry_points: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata sees it: ``DIST-0.1.dist-info`` with METADATA and
    ``entry_points.txt`` in a directory on the path."""
    info = directory / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[steerdiff.plugins]\n{lines}")


def test_entry_point_plugins_are_loaded(tmp_path):
    """A distribution declaring a module and a function under ``steerdiff.plugins``: both are loaded (the module
    imported, the function called), and the names they register are offered and run, without STEERDIFF_PLUGINS."""
    site = tmp_path / "site"
    _write_plugin(site, "ep_module", PARTS[:1])
    (site / "ep_hook.py").write_text(HEADER + textwrap.dedent('''
        def register():
        ''') + textwrap.indent(textwrap.dedent(PARTS[1].code), "    "))
    _fake_distribution(site, "fakeplug", {"guiders": "ep_module", "samplers": "ep_hook:register"})
    env = _env(site)
    res = _cli(["sample", "--help"], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "plugin-guider" in res.stdout and "plugin_jump" in res.stdout
    out = tmp_path / "out"
    res = _cli([*PARTS[1].run, "--out", str(out)], env, tmp_path)  # the sampler the called function registered
    assert res.returncode == 0, res.stdout + res.stderr
    PARTS[1].check(out, tmp_path)


def test_a_failing_entry_point_names_its_distribution(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    _fake_distribution(site, "fakebad", {"broken": "broken_plugin"})
    res = _cli(["sample", "--n", "4", "--out", str(tmp_path / "o")], _env(site), tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "'fakebad'" in res.stderr and "'broken'" in res.stderr and "RuntimeError: boom at import" in res.stderr


@pytest.mark.parametrize("value, words", [
    ("no_such_plugin_module", ["'no_such_plugin_module'", "STEERDIFF_PLUGINS", "was not found", "PYTHONPATH",
                               "current directory"]),
    ("raising_plugin", ["'raising_plugin'", "STEERDIFF_PLUGINS", "failed to import", "ZeroDivisionError"]),
])
def test_a_bad_plugin_is_a_clear_error(value, words, tmp_path):
    (tmp_path / "raising_plugin.py").write_text("x = 1 / 0\n")
    res = _cli(["sample", "--n", "4", "--out", str(tmp_path / "o")], _env(tmp_path, STEERDIFF_PLUGINS=value),
               tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("Error: ") and all(w in res.stderr for w in words), res.stderr
    assert not (tmp_path / "o").exists()


def test_load_plugins_reads_the_variable_once_per_module(tmp_path, monkeypatch):
    """In-process: the modules named in the variable are imported in order, each once; blanks are ignored; a path
    instead of a module name is refused by name."""
    from steerdiff.io import plugin_loader as plugins

    (tmp_path / "count_plugin_a.py").write_text("import builtins\n"
                                                "builtins.COUNT_A = getattr(builtins, 'COUNT_A', 0) + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {plugins.ENV_VAR: " count_plugin_a, ,count_plugin_a "}
    assert plugins.plugin_names(env) == ["count_plugin_a"]
    with pytest.raises(plugins.PluginError, match="'plugins/my_plugin.py' is not a Python module name"):
        plugins.plugin_names({plugins.ENV_VAR: "plugins/my_plugin.py"})
    import builtins

    try:
        assert plugins.load_plugins(env, entry_points=False) == ["env:count_plugin_a"]
        assert plugins.load_plugins(env, entry_points=False) == ["env:count_plugin_a"]
        assert builtins.COUNT_A == 1
    finally:
        del builtins.COUNT_A
        plugins._loaded.pop("env:count_plugin_a", None)
        sys.modules.pop("count_plugin_a", None)


FAMILY_PLUGIN = '''
from steerdiff.pipelines import register_family
from steerdiff.pipelines.families import StableDiffusion


@register_family("plugin_sd_img2img")
class PluginImg2Img(StableDiffusion):
    """diffusers' StableDiffusionImg2ImgPipeline (the same components as SD 1.x), sampled from noise."""

    pipeline_class = "StableDiffusionImg2ImgPipeline"
'''


def test_a_pipeline_family_plugin_reaches_the_command_line(tmp_path):
    """A plugin registering a pipeline family for a diffusers class no built-in family takes (the image-to-image SD
    pipeline, saved from the components of a tiny random-weight SD 1.x pipeline): without the plugin
    ``steerdiff sample --pipeline`` refuses the directory, naming the class; with it (``STEERDIFF_PLUGINS``) the
    run succeeds and its images equal those of the built-in SD family on the same components (the independent
    reference: the same weights saved as a StableDiffusionPipeline)."""
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    import tiny_pipelines

    from steerdiff.app.recipes.clip_tokenizer import write_clip_tokenizer

    write_clip_tokenizer(tmp_path / "tok")
    pipe = tiny_pipelines.make_sd(tmp_path / "tok")
    pipe.save_pretrained(tmp_path / "sd")
    diffusers.StableDiffusionImg2ImgPipeline(**pipe.components).save_pretrained(tmp_path / "img2img")
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "family_plugin.py").write_text(FAMILY_PLUGIN)
    run = ["sample", "--prompt", "a red disk", "--n", "2", "--steps", "3", "--scale", "4", "--seed", "5",
           "--no-progress"]
    without = _cli([*run, "--pipeline", str(tmp_path / "img2img"), "--out", str(tmp_path / "x")],
                   _env(plugin_dir), tmp_path)
    assert without.returncode != 0 and "StableDiffusionImg2ImgPipeline" in without.stderr, without.stderr
    env = _env(plugin_dir, STEERDIFF_PLUGINS="family_plugin")
    runs = {name: _cli([*run, "--pipeline", str(tmp_path / name), "--out", str(tmp_path / f"out_{name}")], env,
                       tmp_path) for name in ("img2img", "sd")}
    assert all(r.returncode == 0 for r in runs.values()), {k: r.stderr for k, r in runs.items()}
    got, ref = _samples(tmp_path / "out_img2img"), _samples(tmp_path / "out_sd")
    assert got.shape == ref.shape == (2, 3, 16, 16) and torch.equal(got, ref)
    assert _metrics(tmp_path / "out_img2img")["nfe"] == _metrics(tmp_path / "out_sd")["nfe"] > 0
