"""Model configs shipped with the library, registered with open_clip by name (e.g. `adacl-tiny`)."""

from pathlib import Path

import open_clip

MODEL_CONFIG_DIR = Path(__file__).parent / "model_configs"


def register_model_configs() -> None:
    """Make our JSON configs visible to `open_clip.create_model*` (idempotent)."""
    if "adacl-tiny" not in open_clip.list_models():
        open_clip.add_model_config(MODEL_CONFIG_DIR)
