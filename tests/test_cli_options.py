"""issue 35: options accepted and ignored, or with two meanings, are refused or given one meaning (the option named)."""

from __future__ import annotations

from click.testing import CliRunner

from steerdiff.app.cli import main


def _sample(tmp_path, *argv):
    return CliRunner().invoke(main, ["sample", "--model", "gmm2d", "--steps", "2", "--no-progress", *argv,
                                     "--out", str(tmp_path / "o")])


def test_duplicate_seeds_are_refused_naming_them(tmp_path):
    # before: 0-3,2 drew seed 2 twice (two equal samples counted as two) without a word
    for seeds, dups in (("0-3,2", "2"), ("1,1", "1"), ("0-9,5-6,9", "5, 6, 9")):
        res = _sample(tmp_path, "--seeds", seeds)
        assert res.exit_code == 2, res.output
        assert "--seeds" in res.output and f"repeats seed{'s' if ',' in dups else ''} {dups}" in res.output, res.output
        assert "Traceback" not in res.output and not (tmp_path / "o").exists()
    res = _sample(tmp_path, "--seeds", "3,0-2")  # any order, each once: fine
    assert res.exit_code == 0, res.output
