"""Files: atomic writes, JSON, safetensors, checkpoint formats, the registry pattern and the plugin loader (the
bottom layer).

Nothing here imports another steerdiff package; every other package builds on it.
"""

from .errors import CheckpointError
from .files import (
    MARKER_NAME,
    add_to_checkpoint,
    atomic_dir,
    atomic_write_bytes,
    atomic_write_text,
    inside_package,
    read_json,
    replace_refusal,
    write_json,
    write_marker,
)
from .formats import (
    CONFIG_NAME,
    FORMATS,
    WEIGHTS_NAME,
    Format,
    check_save_target,
    find_format,
    find_marked_format,
    find_saver,
    load_directory,
    register_format,
    save_object,
)
from .plugin_loader import PluginError, load_plugins
from .plugins import Registry
from .tensors import (
    PICKLE_SUFFIXES,
    flatten_optimizer_state,
    load_state_strict,
    load_tensors,
    save_tensors,
    unflatten_optimizer_state,
)
from .version import __version__

__all__ = [
    "CONFIG_NAME",
    "FORMATS",
    "MARKER_NAME",
    "PICKLE_SUFFIXES",
    "WEIGHTS_NAME",
    "CheckpointError",
    "Format",
    "PluginError",
    "Registry",
    "__version__",
    "add_to_checkpoint",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_save_target",
    "find_format",
    "find_marked_format",
    "find_saver",
    "flatten_optimizer_state",
    "inside_package",
    "load_directory",
    "load_plugins",
    "load_state_strict",
    "load_tensors",
    "read_json",
    "register_format",
    "replace_refusal",
    "save_object",
    "save_tensors",
    "unflatten_optimizer_state",
    "write_json",
    "write_marker",
]
