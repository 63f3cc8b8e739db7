"""The one plug-in pattern: a registry's names, aliases, duplicate rule and error message, and the checkpoint
formats that ``steerdiff.models.load`` dispatches on."""

import pytest

from steerdiff.io import CheckpointError, Registry, find_format, register_format
from steerdiff.io.formats import FORMATS
from steerdiff.models import MLP, EDMPrecond, load, save


def f():
    return 1


def g():
    return 2


def test_names_aliases_and_the_error_lists_what_exists():
    reg = Registry("widget", argument="kind")
    reg.add("alpha", f, aliases=("a",))
    reg.register("beta")(g)
    assert reg.names() == ["alpha", "beta"] and "a" in reg and "gamma" not in reg
    assert reg.get("a") is f and reg.get("beta") is g and len(reg) == 2
    with pytest.raises(ValueError, match=r"kind must be one of \['alpha', 'beta'\], got 'gamma'"):
        reg.get("gamma")
    reg.remove("alpha")
    assert "a" not in reg and reg.names() == ["beta"]


def test_a_different_entry_under_a_taken_name_is_refused_the_same_one_is_not():
    reg = Registry("widget")
    reg.add("alpha", f)
    reg.add("alpha", f)  # the same entry again (a module imported twice): a no-op
    with pytest.raises(ValueError, match="a different widget is already registered as 'alpha'"):
        reg.add("alpha", g)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", g)


def test_formats_dispatch_on_the_config_class(tmp_path):
    assert find_format({"class": "QuantizedModel"}).name == "quantized"
    assert find_format({"class": "EDMPrecond"}).name == "model"  # the default format
    seen = []

    @register_format("test_packed", config_class="TestPacked")
    def load_packed(directory, spec, device="cpu"):
        seen.append(spec["payload"])
        return "loaded"

    try:
        model = EDMPrecond(MLP(dim=2, hidden=[8]))
        save(model, tmp_path / "m")
        cfg = tmp_path / "m" / "config.json"
        cfg.write_text('{"class": "TestPacked", "payload": 7}')
        assert load(tmp_path / "m") == "loaded" and seen == [7]
        cfg.write_text('{"class": "NoSuchClass", "config": {}}')
        with pytest.raises(CheckpointError, match="unknown model class 'NoSuchClass'"):
            load(tmp_path / "m")
    finally:
        FORMATS.remove("test_packed")
    with pytest.raises(ValueError, match="default checkpoint format"):
        register_format("second_default", config_class=None)(lambda d, s, device="cpu": None)
