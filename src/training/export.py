"""Export a training checkpoint as a folder that stock open_clip loads: `local-dir:DIR`, or a hub model folder.

    python -m training.export --checkpoint logs/RUN/checkpoints/epoch_5.pt --output export/
    # then, in any environment with open_clip_torch (no open_clip_adacl needed):
    open_clip.create_model_and_transforms("local-dir:export/")
    clip_benchmark eval --model local-dir:export/ --pretrained none ...

    python -m training.export --checkpoint .../epoch_5.pt --hf-dir hub/ --repo-id ORG/NAME
    hf upload ORG/NAME hub/     # then open_clip loads 'hf-hub:ORG/NAME'

DIR/open_clip_config.json holds {"model_cfg": ..., "preprocess_cfg": ...} (what open_clip's
local-dir and hf-hub loaders read: the architecture, forced image size / context length and
logit-bias init included, and the image preprocessing); DIR/open_clip_model.safetensors holds the
weights (no DDP 'module.' prefix). The export is checked by loading it back with open_clip before
returning. `--hf-dir` writes the same files plus what a hub model repository holds: README.md, a
model card (open_clip's `generate_readme`) with the training command, the checkpoint's progress and
the run's validation results, and the tokenizer's files for Hugging Face tokenizers (open_clip's
default tokenizer is fully described by the config's text_cfg, which is why open_clip's own
`save_for_hf`, calling `tokenizer.save_pretrained`, fails for it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import open_clip
import torch
from open_clip.push_to_hf_hub import generate_readme
from safetensors.torch import save_file

from .checkpoint import load_checkpoint
from .params import command_line
from .run_records import RESULTS_NAME  # the trainer's validation results, next to the checkpoints

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"
README_NAME = "README.md"


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
    return _export_loaded(load_checkpoint(checkpoint_path), output_dir, model_name)


def export_for_hub(checkpoint_path: str | Path, hf_dir: str | Path, *, repo_id: str,
                   model_name: Optional[str] = None) -> Path:
    """`export` plus the model card (README.md) and tokenizer files of a hub model repository; returns DIR."""
    checkpoint = load_checkpoint(checkpoint_path)
    hf_dir = _export_loaded(checkpoint, hf_dir, model_name)
    tokenizer = open_clip.get_tokenizer(f"local-dir:{hf_dir}")
    if hasattr(tokenizer, "save_pretrained"):  # Hugging Face tokenizers only (see the module docstring)
        tokenizer.save_pretrained(str(hf_dir))
    results_file = Path(checkpoint_path).parent / RESULTS_NAME
    results = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.is_file() else []
    card = model_card(checkpoint, results, repo_id)
    (hf_dir / README_NAME).write_text(generate_readme(card, repo_id.split("/")[-1]))
    return hf_dir


def model_card(checkpoint: Dict[str, Any], results: list, repo_id: str) -> Dict[str, Any]:
    """open_clip's model-card dict: what was trained how (the exact command), and its validation results."""
    args = checkpoint.get("args", {})
    details = {
        "Architecture": args.get("model", "see open_clip_config.json"),
        "Loss": args.get("loss", "unknown"),
        "Training data": args.get("train_data", "unknown"),
        "Trained": f"{checkpoint.get('epoch', '?')} epochs, {checkpoint.get('step', '?')} steps",
        "Training command": f"`{command_line(args)}`" if args else "not recorded (not written by training.main)",
    }
    usage = ("```python\nimport open_clip\n\n"
             f"model, _, preprocess = open_clip.create_model_and_transforms('hf-hub:{repo_id}')\n"
             f"tokenizer = open_clip.get_tokenizer('hf-hub:{repo_id}')\n```\n")
    # The last record of the checkpoint's own epoch: a later one belongs to training it does not hold.
    own = [record for record in results if record.get("epoch") == checkpoint.get("epoch")]
    if own:
        rows = "".join(f"| {name} | {value:.4f} |\n" for name, value in own[-1].items() if name != "epoch")
        comparison = (f"Validation after epoch {own[-1]['epoch']} (the trainer's results.jsonl):\n\n"
                      f"| metric | value |\n|---|---|\n{rows}")
    else:
        comparison = (f"No validation results were recorded after epoch {checkpoint.get('epoch', '?')}, this "
                      "checkpoint's.")
    return {
        "description": "A CLIP model trained with open_clip_adacl (OpenCLIP's trainer with pluggable "
                       "contrastive losses), exported from its checkpoint.",
        "details": details,
        "usage": usage,
        "comparison": comparison,
        "tags": ("clip", "open_clip", "open_clip_adacl"),
    }


def _export_loaded(checkpoint: Dict[str, Any], output_dir: str | Path, model_name: Optional[str]) -> Path:
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
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--output", help="folder to write (loadable as local-dir:FOLDER)")
    target.add_argument("--hf-dir", help="hub model folder to write: --output's files plus README.md (model card) "
                                         "and tokenizer files; upload it with hf upload ORG/NAME FOLDER")
    parser.add_argument("--repo-id", default="ORG/NAME",
                        help="with --hf-dir: the hub repository the model card's usage example names")
    parser.add_argument("--model", default=None,
                        help="model config name, only for checkpoints not written by training.main")
    args = parser.parse_args(argv)
    if args.hf_dir:
        output = export_for_hub(args.checkpoint, args.hf_dir, repo_id=args.repo_id, model_name=args.model)
        print(f"exported {args.checkpoint} to {output} for the hub (upload: hf upload "
              f"{args.repo_id} {output}; load locally with open_clip: 'local-dir:{output}')")
        return output
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
