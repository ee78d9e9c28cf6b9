"""In-training validation, called by the trainer every `--val-frequency` / `--zeroshot-frequency` epochs.

- `run_validation`: OpenCLIP's `evaluate` on the val shards: the CLIP loss averaged over val
  batches (`clip_val_loss`) and image-to-text / text-to-image retrieval over the whole val set
  (mean/median rank, R@1/5/10, computed by OpenCLIP's own `get_clip_metrics`).
- `imagenet_folder`: the ImageNet val `ImageFolder`, checked (1000 class folders with images) when
  a run starts; `zero_shot_imagenet`: zero-shot top-1/top-5 on it, with the classifier built by
  open_clip's `build_zero_shot_classifier`.
- `epoch_results`, `eval_line`, `write_results`: an evaluated epoch's metrics as OpenCLIP's `evaluate` reports
  them: its `Eval Epoch: N key: value\t...` line, one JSON line in `results.jsonl` under its keys
  (`image_to_text_R@1`, `clip_val_loss`, `imagenet-zeroshot-val-top1`, `epoch`, `num_samples`, in its order),
  and `dashboard_values`, the same under its TensorBoard tags (`val/<key>`) for metrics.jsonl. The project's
  extra, `clip_val_loss_chance`, comes after OpenCLIP's keys.
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager, Iterable, Mapping, Sequence

import torch
import torchvision
from open_clip import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES, ClipLoss, build_zero_shot_classifier
from open_clip_train.train import get_clip_metrics
from tqdm import tqdm

from ..run_folder.safe_write import RunFiles

METRIC_PREFIX = "val/"  # OpenCLIP's tensorboard tags of the evaluated metrics
EXTRA_METRICS = ("clip_val_loss_chance",)  # ours, beside OpenCLIP's keys


def progress(iterable: Iterable, description: str) -> Iterable:
    """Wrap `iterable` in a tqdm bar on an interactive terminal; plain iteration in logs and CI."""
    try:
        total = len(iterable)  # type: ignore[arg-type]
    except TypeError:  # an IterableDataset's loader has no length
        total = None
    return tqdm(iterable, desc=description, total=total, leave=False, disable=not sys.stderr.isatty())


def clip_outputs(model_out: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(image_features, text_features, logit_scale) from a CLIP forward, dict or tuple output."""
    if isinstance(model_out, Mapping):
        return model_out["image_features"], model_out["text_features"], model_out["logit_scale"]
    return tuple(model_out[:3])


def run_validation(
    model: torch.nn.Module,
    dataloader: Iterable,
    *,
    device: torch.device | str,
    autocast: Callable[[], ContextManager] = nullcontext,
    epoch: int,
    input_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """CLIP val loss and retrieval recall over every batch of `dataloader` (pass the unwrapped model).

    Batches are `(images, texts, sample_index, skipped)` tuples (only the first two are used).
    The loss is OpenCLIP's: `ClipLoss` within each batch (vanilla contrastive, whatever loss
    trained the model, so runs with different losses stay comparable), averaged over samples.
    Recall ranks each image's caption among all val captions and vice versa; features are kept
    on the CPU, so the val set must fit an N x N similarity matrix, as in OpenCLIP.

    Returns, under OpenCLIP's keys and in its order, for `image_to_text` and `text_to_image`
    `<direction>_mean_rank`, `_median_rank` and `_R@1|5|10`, then `clip_val_loss` and `num_samples`, then ours:
    `clip_val_loss_chance`, the CLIP loss's chance value (the same average of ln(batch size): what equal logits give).
    """
    device = torch.device(device)
    clip_loss = ClipLoss()
    model.eval()
    image_features, text_features = [], []
    cumulative_loss, cumulative_chance, num_samples = 0.0, 0.0, 0
    with torch.inference_mode():
        for batch in progress(dataloader, f"val epoch {epoch}"):
            images = batch[0].to(device=device, dtype=input_dtype)
            texts = batch[1].to(device=device)
            with autocast():
                batch_image_features, batch_text_features, logit_scale = clip_outputs(model(images, texts))
                batch_loss = clip_loss(batch_image_features, batch_text_features, logit_scale.mean())
            image_features.append(batch_image_features.float().cpu())
            text_features.append(batch_text_features.float().cpu())
            cumulative_loss += batch_loss.item() * len(images)
            cumulative_chance += math.log(len(images)) * len(images)  # ClipLoss of equal logits: ln(batch)
            num_samples += len(images)
    if num_samples == 0:
        raise ValueError("the validation dataloader yielded no samples")
    retrieval = get_clip_metrics(
        image_features=torch.cat(image_features),
        text_features=torch.cat(text_features),
        logit_scale=logit_scale.mean().float().cpu(),
    )
    metrics = {
        **retrieval,
        "clip_val_loss": cumulative_loss / num_samples,
        "num_samples": num_samples,
        "clip_val_loss_chance": cumulative_chance / num_samples,
    }
    return {name: float(value) for name, value in metrics.items()}


def imagenet_folder(
    imagenet_dir: str | Path, transform: Callable | None = None, *, num_classes: int = len(IMAGENET_CLASSNAMES)
) -> torchvision.datasets.ImageFolder:
    """The `ImageFolder` over `imagenet_dir`, checked to hold `num_classes` class folders with images.

    Raises ValueError saying what is wrong (missing folder, wrong number of classes, an empty class),
    so that a bad folder fails when a run starts rather than at its first zero-shot evaluation.
    """
    imagenet_dir = Path(imagenet_dir)
    if not imagenet_dir.is_dir():
        raise ValueError(
            f"{imagenet_dir} is not a directory; pass ImageNet's val set as one folder per class "
            f"(e.g. val/n01440764/*.JPEG, the layout torchvision's ImageFolder reads)"
        )
    classes = [entry.name for entry in imagenet_dir.iterdir() if entry.is_dir()]
    if len(classes) != num_classes:
        raise ValueError(
            f"{imagenet_dir} has {len(classes)} class folders, expected {num_classes} (one per ImageNet "
            f"synset, e.g. n01440764/); a flat folder of images needs sorting into class folders first"
        )
    try:
        return torchvision.datasets.ImageFolder(str(imagenet_dir), transform=transform)
    except FileNotFoundError as error:  # a class folder without a single image
        raise ValueError(f"{imagenet_dir}: {error}") from error


def zero_shot_imagenet(
    model: torch.nn.Module,
    tokenizer: Callable[[list[str]], torch.Tensor],
    dataset: torchvision.datasets.ImageFolder,
    *,
    device: torch.device | str,
    autocast: Callable[[], ContextManager] = nullcontext,
    batch_size: int = 64,
    workers: int = 0,
    classnames: Sequence[str] = IMAGENET_CLASSNAMES,
    templates: Sequence[str | Callable[[str], str]] = OPENAI_IMAGENET_TEMPLATES,
    input_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """Zero-shot top-1/top-5 accuracy on an `ImageFolder` (e.g. ImageNet's val set, one folder per synset,
    from `imagenet_folder` with the model's val transform).

    `classnames[k]` names the k-th class folder in sorted order (ImageFolder's order, which is
    the synset order of open_clip's `IMAGENET_CLASSNAMES`); `templates` are all callables or all
    `str.format` strings with one `{}` (open_clip's convention). Top-5 is reported only when
    there are at least 5 classes. Returns `imagenet-zeroshot-val-top1` (and `-top5`),
    OpenCLIP's names.
    """
    device = torch.device(device)
    if len(dataset.classes) != len(classnames):
        raise ValueError(
            f"{dataset.root} has {len(dataset.classes)} class folders but {len(classnames)} class names were given"
        )
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    model.eval()
    with torch.inference_mode(), autocast():
        classifier = build_zero_shot_classifier(
            model,
            tokenizer=tokenizer,
            classnames=classnames,
            templates=templates,
            num_classes_per_batch=10,
            device=device,
            use_tqdm=sys.stderr.isatty(),
        )
    top_k = [k for k in (1, 5) if k <= len(classnames)]
    num_correct = dict.fromkeys(top_k, 0)
    with torch.inference_mode():
        for images, target in progress(dataloader, "zero-shot imagenet"):
            images = images.to(device=device, dtype=input_dtype)
            with autocast():
                logits = model.encode_image(images, normalize=True) @ classifier
            ranked = logits.float().topk(max(top_k), dim=1).indices.cpu()
            for k in top_k:
                num_correct[k] += (ranked[:, :k] == target[:, None]).any(dim=1).sum().item()
    return {f"imagenet-zeroshot-val-top{k}": num_correct[k] / len(dataset) for k in top_k}


def epoch_results(
    epoch: int, zero_shot: Mapping[str, float], validation: Mapping[str, float]
) -> dict[str, float | int]:
    """An evaluated epoch's metrics in the order of OpenCLIP's `evaluate` (`open_clip_train.train`: the zero-shot
    ones, then `get_clip_metrics`'s, `clip_val_loss`, `epoch`, `num_samples`), then the project's extras. `epoch`
    is there also when only zero-shot ran (OpenCLIP then leaves it out): a resume cuts results.jsonl back by it."""
    validation = dict(validation)
    extras = {name: validation.pop(name) for name in EXTRA_METRICS if name in validation}
    num_samples = {"num_samples": validation.pop("num_samples")} if "num_samples" in validation else {}
    return {**zero_shot, **validation, "epoch": epoch, **num_samples, **extras}


def eval_line(results: Mapping[str, float]) -> str:
    """OpenCLIP's `Eval Epoch: N key: value<TAB>key: value...` line of `epoch_results`."""
    return f"Eval Epoch: {results['epoch']} " + "\t".join(
        f"{key}: {round(value, 4):.4f}" for key, value in results.items()
    )


def dashboard_values(results: Mapping[str, float]) -> dict[str, float]:
    """`epoch_results` under OpenCLIP's tensorboard tags (`val/<key>`): a "val" line of metrics.jsonl."""
    return {METRIC_PREFIX + key: value for key, value in results.items()}


def write_results(path: str | Path, results: Mapping[str, float], files: RunFiles | None = None) -> None:
    """Append `epoch_results` as one JSON line to `path` (`<run>/checkpoints/results.jsonl`), as OpenCLIP writes
    it, through the run's `files` (a failed write is logged and retried later, `training.trainer.run_folder.safe_write`)."""
    (files or RunFiles()).append(path, json.dumps(dict(results)) + "\n")
