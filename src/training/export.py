"""Export a training checkpoint as a folder that stock open_clip loads: `local-dir:DIR`.

    python -m training.export --checkpoint logs/RUN/checkpoints/epoch_5.pt --output export/
    # then, in any environment with open_clip_torch (no open_clip_adacl needed):
    open_clip.create_model_and_transforms("local-dir:export/")
    clip_benchmark eval --model local-dir:export/ --pretrained none ...

DIR/open_clip_config.json holds {"model_cfg": ..., "preprocess_cfg": ...} (what open_clip's
local-dir loader reads: the architecture, forced image size / context length and logit-bias init
included, and the image preprocessing); DIR/open_clip_model.safetensors holds the weights (no DDP
'module.' prefix). The export is checked by loading it back with open_clip before returning.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import open_clip
import torch
from safetensors.torch import save_file

from .checkpoint import load_checkpoint

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"


def _configs(checkpoint: Dict[str, Any], model_name: Optional[str]) -> Dict[str, Any]:
    """model_cfg / preprocess_cfg recorded by the trainer, or those of `model_name` (OpenCLIP checkpoints)."""
    if "model_cfg" in checkpoint and model_name is None:
        return {"model_cfg": checkpoint["model_cfg"], "preprocess_cfg": checkpoint.get("preprocess_cfg", {})}
    if model_name is None:
        raise ValueError("the checkpoint records no model config (not written by training.main); pass --model NAME")
    import open_clip_adacl  # noqa: F401  (our configs, e.g. adacl-tiny, for --model)

    model_cfg = open_clip.get_model_config(model_name)
    if model_cfg is None:
        raise ValueError(f"unknown --model {model_name!r}")
    model = open_clip.create_model(model_name, load_weights=False)
    return {"model_cfg": model_cfg, "preprocess_cfg": dict(open_clip.get_model_preprocess_cfg(model))}


def export(checkpoint_path: str | Path, output_dir: str | Path, *, model_name: Optional[str] = None) -> Path:
    """Write DIR/open_clip_config.json and DIR/open_clip_model.safetensors; returns DIR."""
    checkpoint = load_checkpoint(checkpoint_path)
    config = _configs(checkpoint, model_name)
    state_dict = checkpoint.get("state_dict", checkpoint)
    state_dict = {(k[len("module."):] if k.startswith("module.") else k): v.contiguous()
                  for k, v in state_dict.items()}
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state_dict, str(output_dir / WEIGHTS_NAME))
    verify_export(output_dir, state_dict)
    return output_dir


def verify_export(output_dir: Path, state_dict: Dict[str, torch.Tensor]) -> None:
    """Load the folder the way users will (stock open_clip) and compare every tensor."""
    model = open_clip.create_model(f"local-dir:{output_dir}")
    loaded = model.state_dict()
    mismatched = [k for k, v in state_dict.items() if k not in loaded or not torch.equal(loaded[k], v)]
    if mismatched:
        raise RuntimeError(f"the export in {output_dir} does not reproduce the checkpoint: {mismatched[:5]}")


def main(argv: Optional[Sequence[str]] = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m training.export", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="training checkpoint (epoch_N.pt, step_N.pt)")
    parser.add_argument("--output", required=True, help="folder to write (loadable as local-dir:FOLDER)")
    parser.add_argument("--model", default=None,
                        help="model config name, only for checkpoints not written by training.main")
    args = parser.parse_args(argv)
    output = export(args.checkpoint, args.output, model_name=args.model)
    print(f"exported {args.checkpoint} to {output} (load with open_clip: 'local-dir:{output}')")
    return output


def cli() -> None:
    try:
        main(sys.argv[1:])
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
