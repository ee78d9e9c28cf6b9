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
model card (huggingface_hub's `ModelCard`: library, license and tags in its metadata) with the training
command, the checkpoint's progress and the run's validation results, and the tokenizer's files for
Hugging Face tokenizers (open_clip's default tokenizer is fully described by the config's text_cfg, which is why open_clip's own
`save_for_hf`, calling `tokenizer.save_pretrained`, fails for it). The card's license is `--license`
(the training data's terms decide it); local paths in the training command are cut to their last
component (`.../{00000..00099}.tar`), URLs and `pipe:` commands kept; `--eval-dir` adds the
clip-benchmark table that `python -m training.evaluation --output-dir` wrote there (results.csv), in the
card's text and as its metadata's model-index, which the hub shows as the model's evaluation results.

Files are written atomically with the umask's mode, as checkpoints are, into an empty (or new) folder: one
that holds something is refused unless `--overwrite`, so an export never sits beside another model's files.
They are written and checked in a staged folder inside it and moved in together at the end, so an export that
fails (a full disk, a read-only folder) leaves none of its files there, and the command says so in one line
naming the file and the cause (exit status 1). A --checkpoint that is a folder, missing or not a weights file
is one line saying so.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import open_clip
import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors.torch import save

from .trainer.launch.params import command_line
from .trainer.launch.tool_flags import OneLineErrorParser, add_trainer_flags
from .trainer.run_folder.checkpoint_digest import CheckpointDamaged
from .trainer.run_folder.checkpoint_files import atomic_file, checkpoint_candidates, load_checkpoint, staged_folder

# the trainer's validation results, next to the checkpoints:
from .trainer.run_folder.layout import CHECKPOINT_DIR_NAME, RESULTS_NAME, read_json_lines
from .trainer.run_folder.safe_write import WRITE_FAILED_STATUS, WriteFailed, tool_writes

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"
README_NAME = "README.md"
EVAL_TABLE_NAME = "results.csv"  # python -m training.evaluation's table: dataset, task, metric, value


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


def export(
    checkpoint_path: str | Path, output_dir: str | Path, *, model_name: Optional[str] = None, overwrite: bool = False
) -> Path:
    """Write DIR/open_clip_config.json and DIR/open_clip_model.safetensors; returns DIR. DIR must be empty
    (or new) unless `overwrite`."""
    check_output_folder(Path(output_dir), overwrite)
    checkpoint = read_checkpoint(checkpoint_path)
    with staged_folder(output_dir) as stage:
        _write_export(checkpoint, stage, model_name)
    return Path(output_dir)


def export_for_hub(
    checkpoint_path: str | Path,
    hf_dir: str | Path,
    *,
    repo_id: str,
    model_name: Optional[str] = None,
    license: str = "other",
    eval_dir: Optional[str | Path] = None,
    overwrite: bool = False,
) -> Path:
    """`export` plus the model card (README.md) and tokenizer files of a hub model repository; returns DIR."""
    check_output_folder(Path(hf_dir), overwrite)  # before reading anything
    evaluation = read_eval_table(Path(eval_dir)) if eval_dir is not None else []  # before writing anything
    checkpoint = read_checkpoint(checkpoint_path)
    results = read_json_lines(Path(checkpoint_path).parent / RESULTS_NAME)
    card = model_card(checkpoint, results, repo_id, license=license, evaluation=evaluation)
    with staged_folder(hf_dir) as stage:
        _write_export(checkpoint, stage, model_name)
        tokenizer = open_clip.get_tokenizer(f"local-dir:{stage}")
        if hasattr(tokenizer, "save_pretrained"):  # Hugging Face tokenizers only (see the module docstring)
            tokenizer.save_pretrained(str(stage))
        _write_text(stage / README_NAME, str(card))
    return Path(hf_dir)


def check_output_folder(folder: Path, overwrite: bool) -> None:
    """Refuse a folder that holds something (unless `overwrite`): the export's files would sit beside another
    model's, and a loader of the folder could not tell them apart."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file: pass a folder to export into")
    if not overwrite and folder.is_dir() and any(folder.iterdir()):
        raise ValueError(f"{folder}: folder not empty: pass an empty one or --overwrite")


def read_checkpoint(path: str | Path) -> Dict[str, Any]:
    """`load_checkpoint` of --checkpoint, each way it can be wrong said in one line with its fix. A file torch
    cannot read as weights is named as such: torch's own message advises weights_only=False, which would run
    whatever code the file holds."""
    path = Path(path)
    if path.is_dir():
        candidates = checkpoint_candidates(path) or checkpoint_candidates(path / CHECKPOINT_DIR_NAME)
        newest = f" (the newest there: {candidates[0]})" if candidates else ""
        raise ValueError(f"--checkpoint {path} is a folder: pass a .pt inside it{newest}")
    if not path.exists():
        raise FileNotFoundError(
            f"--checkpoint {path}: no such file; pass a checkpoint training.main wrote "
            "(<logs>/<name>/checkpoints/epoch_N.pt or step_N.pt)"
        )
    try:
        return load_checkpoint(path)
    except CheckpointDamaged:
        raise
    except Exception as error:  # noqa: BLE001 - any unreadable file: a truncated zip, a pickle of objects, text
        raise ValueError(
            f"--checkpoint {path} is not a weights file torch can read ({type(error).__name__}: "
            "truncated, or not a checkpoint); pass an epoch_N.pt or step_N.pt training.main wrote"
        ) from None


def read_eval_table(eval_dir: Path) -> List[Dict[str, str]]:
    """The rows of EVAL_DIR/results.csv (dataset, task, metric, value), as training.evaluation wrote them."""
    table = eval_dir / EVAL_TABLE_NAME
    if not table.is_file():
        raise FileNotFoundError(
            f"--eval-dir {eval_dir}: no {EVAL_TABLE_NAME} there (write it with python -m "
            f"training.evaluation --output-dir {eval_dir})"
        )
    with table.open(newline="") as f:
        return list(csv.DictReader(f))


def public_value(value: Any) -> Any:
    """`value` with every local path (of a "::"-joined list too) cut to `.../<last component>`; URLs, `pipe:`
    commands, hub names and plain values are kept. Any other text with a "/" is a path: a relative one
    (`--logs demo/logs`) names the trainer's machine as much as an absolute one, and the card is read elsewhere."""
    if isinstance(value, (list, tuple)):
        return type(value)(public_value(item) for item in value)
    if not isinstance(value, str) or "/" not in value:
        return value
    return "::".join(
        part if "://" in part or part.startswith(("pipe:", "hf-hub:")) or "/" not in part else f".../{Path(part).name}"
        for part in value.split("::")
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; floats to 4 decimals."""
    cells = [[f"{cell:.4f}" if isinstance(cell, float) else str(cell) for cell in row] for row in rows]
    lines = ["| " + " | ".join(line) + " |" for line in (header, *cells)]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines) + "\n"


# clip-benchmark's task names as the hub's task ids, where the hub has one (model-index task.type)
HUB_TASK_TYPES = {"zeroshot_classification": "zero-shot-image-classification"}


def eval_result(row: Dict[str, str]) -> EvalResult:
    """One row of training.evaluation's table as the hub's model-index entry."""
    return EvalResult(
        task_type=HUB_TASK_TYPES.get(row["task"], row["task"]),
        task_name=row["task"],
        dataset_type=row["dataset"],
        dataset_name=row["dataset"],
        metric_type=row["metric"],
        metric_value=float(row["value"]),
    )


def model_card(
    checkpoint: Dict[str, Any],
    results: list,
    repo_id: str,
    *,
    license: str = "other",
    evaluation: Sequence[Dict[str, str]] = (),
) -> ModelCard:
    """The hub model card: metadata (library, license, tags and, when given, the clip-benchmark `evaluation`
    rows as model-index results) over what was trained how (the exact command, local paths cut), its
    validation results and the clip-benchmark table."""
    model_name = repo_id.split("/")[-1]
    args = {name: public_value(value) for name, value in checkpoint.get("args", {}).items()}
    details = {
        "Architecture": args.get("model", "see open_clip_config.json"),
        "Loss": args.get("loss", "unknown"),
        "Training data": args.get("train_data", "unknown"),
        "Trained": f"{checkpoint.get('epoch', '?')} epochs, {checkpoint.get('step', '?')} steps",
        "Training command": f"`{command_line(args)}`" if args else "not recorded (not written by training.main)",
    }
    usage = (
        "```python\nimport open_clip\n\n"
        f"model, _, preprocess = open_clip.create_model_and_transforms('hf-hub:{repo_id}')\n"
        f"tokenizer = open_clip.get_tokenizer('hf-hub:{repo_id}')\n```\n"
    )
    # The last line of the checkpoint's own epoch: a later one belongs to training it does not hold, and so does that
    # epoch's own line for a checkpoint saved inside the next epoch (a step_N.pt: validation ran at the boundary).
    position = checkpoint.get("data") if isinstance(checkpoint.get("data"), dict) else {}
    into_epoch = position.get("batches_in_epoch", 0)
    own = [line for line in results if line.get("epoch") == checkpoint.get("epoch")] if not into_epoch else []
    if own:
        comparison = f"Validation after epoch {own[-1]['epoch']} (the trainer's results.jsonl):\n\n" + markdown_table(
            ["metric", "value"], [(name, value) for name, value in own[-1].items() if name != "epoch"]
        )
    elif into_epoch:
        comparison = (
            f"No validation results belong to these weights: they were saved {into_epoch} batch(es) into epoch "
            f"{checkpoint.get('epoch', '?')}, and the trainer validates at the end of an epoch."
        )
    else:
        comparison = (
            f"No validation results were recorded after epoch {checkpoint.get('epoch', '?')}, this checkpoint's."
        )
    if evaluation:
        comparison += (
            "\nZero-shot evaluation with clip-benchmark (python -m training.evaluation):\n\n"
            + markdown_table(
                ["dataset", "task", "metric", "value"],
                [(row["dataset"], row["task"], row["metric"], float(row["value"])) for row in evaluation],
            )
        )
    eval_results = [eval_result(row) for row in evaluation]
    data = ModelCardData(
        library_name="open_clip",
        pipeline_tag="zero-shot-image-classification",
        license=license,
        tags=["clip", "open_clip", "open_clip_adacl"],
        # model_name names the model-index; without one it would be a stray metadata key
        model_name=model_name if eval_results else None,
        eval_results=eval_results or None,
    )
    body = (
        f"# Model card for {model_name}\n\n"
        "A CLIP model trained with open_clip_adacl (OpenCLIP's trainer with pluggable contrastive losses), "
        "exported from its checkpoint.\n\n## Model Details\n"
        + "".join(f"- **{key}:** {value}\n" for key, value in details.items())
        + f"\n## Model Usage\n{usage}\n## Model Comparison\n{comparison}\n"
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def _write_text(path: Path, text: str) -> None:
    with atomic_file(path, "w") as f:
        f.write(text)


def _write_export(checkpoint: Dict[str, Any], folder: Path, model_name: Optional[str]) -> None:
    """The config and the weights into `folder` (a staged one: `staged_folder`), checked by loading them back."""
    config = _configs(checkpoint, model_name)
    state_dict = checkpoint.get("state_dict", checkpoint)
    state_dict = {
        (k[len("module.") :] if k.startswith("module.") else k): v.contiguous() for k, v in state_dict.items()
    }
    _write_text(folder / CONFIG_NAME, json.dumps(config, indent=2) + "\n")
    with atomic_file(folder / WEIGHTS_NAME) as f:  # safetensors' save_file would leave it 0600
        f.write(save(state_dict))
    verify_export(folder, state_dict)


def verify_export(output_dir: Path, state_dict: Dict[str, torch.Tensor]) -> None:
    """Load the folder the way users will (stock open_clip) and compare every tensor."""
    model = open_clip.create_model(f"local-dir:{output_dir}")
    loaded = model.state_dict()
    mismatched = [k for k, v in state_dict.items() if k not in loaded or not torch.equal(loaded[k], v)]
    if mismatched:
        raise RuntimeError(f"the export does not reproduce the checkpoint: {mismatched[:5]}")


def main(argv: Optional[Sequence[str]] = None) -> Path:
    parser = OneLineErrorParser(prog="python -m training.export", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="training checkpoint (epoch_N.pt, step_N.pt)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--output", help="folder to write (loadable as local-dir:FOLDER)")
    target.add_argument(
        "--hf-dir",
        help="hub model folder to write: --output's files plus README.md (model card) "
        "and tokenizer files; upload it with hf upload ORG/NAME FOLDER",
    )
    parser.add_argument(
        "--repo-id", default="ORG/NAME", help="with --hf-dir: the hub repository the model card's usage example names"
    )
    parser.add_argument(
        "--license",
        default="other",
        help="with --hf-dir: the model card's license id (mit, apache-2.0, cc-by-4.0, ...; the training "
        "data's terms decide it) (default: other)",
    )
    parser.add_argument(
        "--eval-dir",
        default=None,
        help="with --hf-dir: a python -m training.evaluation --output-dir folder; its clip-benchmark "
        "table goes into the model card",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a folder that is not empty, replacing the export's files there (others stay)",
    )
    add_trainer_flags(
        parser,
        ("model",),
        defaults={"model": None},
        notes={"model": "Here: only for checkpoints not written by training.main."},
    )
    args = parser.parse_args(argv)
    if not args.hf_dir and (args.eval_dir or args.license != "other"):
        parser.error("--license and --eval-dir go into the model card: use them with --hf-dir")
    target = "--hf-dir" if args.hf_dir else "--output"
    with tool_writes(
        args.hf_dir or args.output, f"free space or choose another {target} (none of the export is left there)"
    ):
        return _run(args)


def _run(args) -> Path:
    if args.hf_dir:
        output = export_for_hub(
            args.checkpoint,
            args.hf_dir,
            repo_id=args.repo_id,
            model_name=args.model,
            license=args.license,
            eval_dir=args.eval_dir,
            overwrite=args.overwrite,
        )
        print(
            f"exported {args.checkpoint} to {output} for the hub (upload: hf upload "
            f"{args.repo_id} {output}; load locally with open_clip: 'local-dir:{output}')"
        )
        return output
    output = export(args.checkpoint, args.output, model_name=args.model, overwrite=args.overwrite)
    print(f"exported {args.checkpoint} to {output} (load with open_clip: 'local-dir:{output}')")
    return output


def cli() -> None:
    """Console entry point (`adacl-export`): a failure prints one line and exits with status 2 (WRITE_FAILED_STATUS:
    the folder took no more writes)."""
    try:
        main(sys.argv[1:])
    except WriteFailed as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(WRITE_FAILED_STATUS)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
