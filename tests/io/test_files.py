"""Writing never loses a user's files: a directory is replaced only when it is a checkpoint steerdiff wrote (its
marker lists everything in it), nothing is written inside the installed package, and files and directories get the
permissions ``open()`` and ``mkdir`` would give them (the user's umask)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import steerdiff as sd
import steerdiff.quant as sq
from steerdiff.app.cli.quantize import quantize_cmd
from steerdiff.io import MARKER_NAME, atomic_dir, atomic_write_text, check_save_target, write_json
from steerdiff.models import MLP, EDMPrecond
from steerdiff.models.io import ASSETS_DIR

PACKAGE_DIR = Path(sd.__file__).resolve().parent


def _tiny():
    torch.manual_seed(0)
    return EDMPrecond(MLP(dim=2, hidden=[16], fourier_dim=8, noise_dim=8)).eval().requires_grad_(False)


def _quantized():
    model = _tiny()
    g = torch.Generator().manual_seed(1)
    sigma = torch.exp(torch.randn(32, generator=g))
    x = torch.randn(32, 2, generator=g) * (1 + sigma[:, None])
    return sq.quantize(model, "w8a8", calib=[(x, sigma, None)])


def _users_folder(root: Path) -> dict[Path, str]:
    """A folder of a user's files that happens to hold a config.json (the issue's reproduction)."""
    files = {root / "config.json": '{"exp": 1}\n', root / "data" / "results.csv": "keep\n", root / "notes.txt": "x"}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


def _all_there(files: dict[Path, str]) -> bool:
    return all(p.is_file() and p.read_text() == text for p, text in files.items())


def test_save_and_quantize_never_delete_a_users_files(tmp_path):
    target = tmp_path / "p"
    files = _users_folder(target)
    with pytest.raises(ValueError, match=f"no checkpoint written by steerdiff \\(no {MARKER_NAME} marker\\)"):
        sd.models.save(_tiny(), target)
    assert _all_there(files)
    with pytest.raises(ValueError, match="no checkpoint written by steerdiff"):
        sq.save(_quantized(), target)
    assert _all_there(files)
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--method", "w8a8",
                                            "--out", str(target)])
    assert res.exit_code == 2, res.output
    assert "--out" in res.output and "no checkpoint written by steerdiff" in res.output
    assert "Traceback" not in res.output
    assert _all_there(files)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == \
        ["config.json", "data", "data/results.csv", "notes.txt"]


def test_a_checkpoint_steerdiff_wrote_is_replaced_but_not_once_a_user_added_to_it(tmp_path):
    target = tmp_path / "ckpt"
    sd.models.save(_tiny(), target)
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["files"] == ["config.json", "model.safetensors"] and marker["steerdiff_version"] == sd.__version__
    model = _tiny()
    torch.nn.init.normal_(model.net.out.weight)
    sd.models.save(model, target)  # a checkpoint it wrote, with nothing added: replaced
    assert torch.equal(sd.models.load(target).net.out.weight, model.net.out.weight)
    (target / "my_notes.md").write_text("keep")
    with pytest.raises(ValueError, match=r"also holds files steerdiff did not write \(my_notes.md\)"):
        sd.models.save(_tiny(), target)
    assert (target / "my_notes.md").read_text() == "keep"
    assert torch.equal(sd.models.load(target).net.out.weight, model.net.out.weight)
    # A marker that does not list a file is no licence either (written by hand or by an older version).
    other = tmp_path / "other"
    other.mkdir()
    (other / MARKER_NAME).write_text(json.dumps({"files": ["config.json"]}))
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_text("mine")
    with pytest.raises(ValueError, match=r"did not write \(model.safetensors\)"):
        check_save_target(other)
    # Absent or empty targets are fine; a quantized checkpoint and its summary are replaced by quantize again.
    (tmp_path / "empty").mkdir()
    assert check_save_target(tmp_path / "empty") == tmp_path / "empty"


def test_quantize_replaces_its_own_output_with_the_summary(tmp_path):
    out = tmp_path / "q"
    args = ["--model", "digits", "--method", "w8a8", "--out", str(out)]
    assert CliRunner().invoke(quantize_cmd, args).exit_code == 0
    listed = json.loads((out / MARKER_NAME).read_text())["files"]
    assert listed == ["config.json", "model.safetensors", "quantization.json"]
    res = CliRunner().invoke(quantize_cmd, args)  # its own output, summary included, is replaceable
    assert res.exit_code == 0, res.output
    (out / "extra.txt").write_text("keep")
    res = CliRunner().invoke(quantize_cmd, args)
    assert res.exit_code == 2 and "extra.txt" in res.output and (out / "extra.txt").read_text() == "keep"


def test_nothing_is_written_inside_the_installed_package(tmp_path):
    shipped = ASSETS_DIR / "digits"
    before = {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()}
    for target in (shipped, ASSETS_DIR / "new_model", PACKAGE_DIR / "x"):
        with pytest.raises(ValueError, match="inside the installed steerdiff package"):
            sd.models.save(_tiny(), target)
        with pytest.raises(ValueError, match="inside the installed steerdiff package"):
            with atomic_dir(target):
                pass
    res = CliRunner().invoke(quantize_cmd, ["--model", "digits", "--method", "w8a8",
                                            "--out", str(shipped)])
    assert res.exit_code == 2 and "--out" in res.output and "inside the installed steerdiff package" in res.output
    assert {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()} == before
    assert not (ASSETS_DIR / "new_model").exists() and not (PACKAGE_DIR / "x").exists()
    assert not (shipped / MARKER_NAME).exists()
    assert sd.models.load("digits") is not None  # shipped checkpoints load without a marker


def test_save_to_an_empty_path_is_refused():
    with pytest.raises(ValueError, match="empty path"):
        sd.models.save(_tiny(), "")


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                         (0o002, 0o664, 0o775)])
def test_written_files_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        write_json(tmp_path / "m.json", {"a": 1})
        sd.models.save(_tiny(), tmp_path / "ckpt")
        with open(tmp_path / "reference.txt", "w") as f:  # what open() gives, the truth to match
            f.write("x")
        (tmp_path / "reference_dir").mkdir()
    finally:
        os.umask(old)

    def mode(p):
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(tmp_path / "reference.txt") == file_mode and mode(tmp_path / "reference_dir") == dir_mode
    assert mode(tmp_path / "a.txt") == file_mode and mode(tmp_path / "m.json") == file_mode
    assert mode(tmp_path / "ckpt") == dir_mode
    for name in ("config.json", "model.safetensors", MARKER_NAME):
        assert mode(tmp_path / "ckpt" / name) == file_mode, name


def test_rewriting_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "shared.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_json(path, {"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and json.loads(path.read_text()) == {"a": 1}


@pytest.mark.parametrize("args", [["sample", "--model", "gmm2d", "--n", "4", "--steps", "2"],
                                  ["restore", "--model", "digits-gmm", "--input", "digits:test:0", "--steps", "2"],
                                  ["align", "--model", "gmm2d", "--reward", "linear:1,0", "--n", "2", "--steps", "2"]])
@pytest.mark.parametrize("where", ["assets/digits", "assets/new_run", "io", ""])
def test_commands_refuse_an_out_inside_the_package_or_empty(args, where):
    from steerdiff.app.cli import main

    out = str(PACKAGE_DIR / where) if where else ""
    before = {p: p.stat().st_mtime_ns for p in ASSETS_DIR.rglob("*")}
    res = CliRunner().invoke(main, [*args, "--no-progress", "--out", out])
    assert res.exit_code == 2, res.output
    assert "--out" in res.output and "Traceback" not in res.output
    assert ("inside the installed steerdiff package" if where else "empty path") in res.output
    assert {p: p.stat().st_mtime_ns for p in ASSETS_DIR.rglob("*")} == before
    assert not (PACKAGE_DIR / "io" / "metrics.json").exists() and not (ASSETS_DIR / "new_run").exists()


def test_an_out_that_cannot_be_created_is_a_clear_error(tmp_path, monkeypatch):
    from steerdiff.app.cli import _common, main

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access, real_mkdir = os.access, Path.mkdir

    def access(path, mode, *args, **kwargs):  # what a non-root user sees in a read-only directory
        return False if Path(path) == locked and mode & os.W_OK else real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(_common.os, "access", access)
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--n", "4", "--steps", "2", "--no-progress",
                                    "--out", str(locked / "sub")])
    assert res.exit_code == 2 and "--out" in res.output and "permission denied" in res.output, res.output
    monkeypatch.undo()

    def mkdir(self, *args, **kwargs):  # a read-only file system: the check passes, creating fails
        if self == tmp_path / "ro" / "sub":
            raise OSError(30, "Read-only file system")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    res = CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--n", "4", "--steps", "2", "--no-progress",
                                    "--out", str(tmp_path / "ro" / "sub")])
    assert res.exit_code == 2 and "--out" in res.output and "Read-only file system" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_symbolic_link_is_not_replaced(tmp_path):
    real = tmp_path / "real"
    sd.models.save(_tiny(), real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(ValueError, match="is a symbolic link"):
        sd.models.save(_tiny(), link)
    assert link.is_symlink() and (real / "config.json").is_file()
