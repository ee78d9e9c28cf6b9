"""The model discovery encodes with: a `local-dir:` export, a trainer checkpoint, or an OpenCLIP name.

- `--model local-dir:DIR` (`python -m training.export`), `hf-hub:ORG/NAME`, or an OpenCLIP /
  open_clip_adacl config name with `--pretrained` (a tag, or a file: an `epoch_N.pt`, an exported
  `open_clip_model.safetensors`, an OpenCLIP state dict), loaded as clip-benchmark loads it;
- `--checkpoint epoch_N.pt`: the architecture the trainer recorded in it, through `training.export`
  into a temporary folder and back with open_clip, as `python -m training.evaluation --checkpoint` does.

A file whose tensors do not fit the named architecture is a one-line ValueError saying how many
differ and which architecture the file was trained as, when it says so.
"""

from __future__ import annotations

import logging
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

import open_clip
import torch
from open_clip.factory import load_state_dict

import open_clip_adacl  # noqa: F401  (registers our model configs, e.g. adacl-tiny, with open_clip)

from ..export import CONFIG_NAME, WEIGHTS_NAME, export
from ..trainer.engine.model import check_pretrained
from ..trainer.run_folder.checkpoint_digest import CheckpointDamaged
from ..trainer.run_folder.checkpoint_files import load_checkpoint

LOCAL_DIR = "local-dir:"
HF_HUB = "hf-hub:"


@dataclass
class DiscoveryModel:
    model: torch.nn.Module
    preprocess: Callable  # the model's validation transform
    tokenizer: Callable
    description: str  # what was loaded, for the report


@contextmanager
def quiet_logging(level: int) -> Iterator[None]:
    """Only log messages of `level` and above for the block (open_clip logs every step of a model load)."""
    root = logging.getLogger()
    previous = root.level
    root.setLevel(max(level, previous))
    try:
        yield
    finally:
        root.setLevel(previous)


def load_discovery_model(
    model_name: Optional[str], pretrained: Optional[str], checkpoint: Optional[str], device: torch.device
) -> DiscoveryModel:
    if checkpoint is not None:
        return _from_checkpoint(Path(checkpoint), model_name, device)
    if model_name is None:
        raise ValueError(
            "no model given: pass --checkpoint epoch_N.pt, --model local-dir:EXPORT, or --model NAME "
            "with --pretrained TAG|FILE"
        )
    if model_name.startswith(LOCAL_DIR) and not (Path(model_name.removeprefix(LOCAL_DIR)) / CONFIG_NAME).is_file():
        raise ValueError(
            f"--model {model_name}: no {CONFIG_NAME} there (write an export with python -m training.export)"
        )
    if pretrained:
        try:
            check_pretrained(model_name, pretrained)
        except ValueError as error:
            raise ValueError(f"--pretrained {pretrained}: {error}") from None
    description = f"{model_name} {weights_description(model_name, pretrained)}"
    return _open_clip_model(model_name, pretrained, device, description)


def weights_description(model_name: str, pretrained: Optional[str]) -> str:
    """Which weights `model_name` is loaded with: a local-dir: export or an hf-hub: repository carries its own."""
    if pretrained:
        return f"--pretrained {pretrained}"
    if model_name.startswith(LOCAL_DIR):
        return f"(the export's weights, {Path(model_name.removeprefix(LOCAL_DIR)) / WEIGHTS_NAME})"
    if model_name.startswith(HF_HUB):
        return "(the hub repository's weights)"
    return "(random weights)"


def _from_checkpoint(path: Path, model_name: Optional[str], device: torch.device) -> DiscoveryModel:
    if not path.is_file():
        raise FileNotFoundError(f"--checkpoint {path} does not exist")
    try:
        checkpoint = load_checkpoint(path, mmap=True)
    except CheckpointDamaged as error:
        raise ValueError(
            f"--checkpoint {path}: {error}; copy it again from where it was written, or pass another checkpoint"
        ) from None
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ValueError(
            f"--checkpoint {path} cannot be read as a checkpoint ({type(error).__name__}); pass an "
            f"epoch_N.pt written by training.main"
        ) from None
    recorded = checkpoint.get("args", {}).get("model") if isinstance(checkpoint, dict) else None
    if isinstance(checkpoint, dict) and "model_cfg" not in checkpoint:
        if model_name is None:
            raise ValueError(
                f"--checkpoint {path} records no architecture (not written by training.main): pass "
                f"--model NAME --pretrained {path} instead"
            )
        return load_discovery_model(model_name, str(path), None, device)
    if model_name is not None and recorded is not None and model_name != recorded:
        raise ValueError(
            f"--checkpoint {path} was trained as --model {recorded} but --model is {model_name}: drop "
            f"--model (the checkpoint names its architecture) or pass --model {recorded}"
        )
    with tempfile.TemporaryDirectory(prefix="discover-export-") as export_dir:
        export(path, export_dir)
        return _open_clip_model(
            f"{LOCAL_DIR}{export_dir}", None, device, f"{path} ({recorded or 'its recorded architecture'})"
        )


def _open_clip_model(
    model_name: str, pretrained: Optional[str], device: torch.device, description: str
) -> DiscoveryModel:
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=pretrained or None, device=device
        )
    except Exception as error:  # noqa: BLE001 - open_clip's loaders raise RuntimeError, AssertionError, ...
        if pretrained and Path(pretrained).is_file():
            raise ValueError(_mismatch(model_name, pretrained)) from None
        raise ValueError(f"--model {model_name}: {type(error).__name__}: {str(error).splitlines()[0]}") from None
    return DiscoveryModel(model.eval(), preprocess, open_clip.get_tokenizer(model_name), description)


def _mismatch(model_name: str, path: str) -> str:
    """One line on how the tensors of `path` differ from `model_name`'s, and what to pass instead."""
    with quiet_logging(logging.ERROR):  # not its "no pretrained weights loaded" warning
        model = open_clip.create_model(model_name, load_weights=False)
    expected: Dict[str, torch.Size] = {name: t.shape for name, t in model.state_dict().items()}
    found = {name: t.shape for name, t in load_state_dict(path).items()}
    shapes = [name for name in expected if name in found and found[name] != expected[name]]
    missing = [name for name in expected if name not in found]
    example = (
        f", e.g. {shapes[0]} is {list(found[shapes[0]])} in the file but {list(expected[shapes[0]])} in {model_name}"
        if shapes
        else ""
    )
    checkpoint = load_checkpoint(path, mmap=True) if path.endswith(".pt") else {}  # check_pretrained read it whole
    recorded = checkpoint.get("args", {}).get("model") if isinstance(checkpoint, dict) else None
    fix = (
        f"it was trained as --model {recorded}: pass that, or --checkpoint {path} alone"
        if recorded
        else "pass the --model it was trained as"
    )
    return (
        f"--pretrained {path} does not fit --model {model_name}: {len(shapes)} of {len(expected)} tensors "
        f"differ in shape and {len(missing)} are missing{example}; {fix}"
    )
