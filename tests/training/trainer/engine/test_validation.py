"""In-training validation: retrieval and loss against brute force, zero-shot on a fake ImageFolder."""

import json
import math

import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.transforms.functional import to_tensor

import open_clip_adacl  # noqa: F401  (registers adacl-tiny)
from training.trainer.data.samples import no_skips
from training.trainer.engine.validation import (
    dashboard_values,
    epoch_results,
    eval_line,
    imagenet_folder,
    run_validation,
    write_results,
    zero_shot_imagenet,
)


class FeatureClip(torch.nn.Module):
    """A CLIP stand-in whose 'images' and 'texts' are already the features, for known answers."""

    def __init__(self, logit_scale: float):
        super().__init__()
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(logit_scale)))

    def forward(self, image, text):
        return {
            "image_features": F.normalize(image, dim=-1),
            "text_features": F.normalize(text, dim=-1),
            "logit_scale": self.logit_scale.exp(),
        }


def feature_batches(image_features, text_features, batch_size):
    """Batches in the trainer's `(images, texts, sample_index, skipped)` format."""
    for start in range(0, len(image_features), batch_size):
        index = torch.arange(start, min(start + batch_size, len(image_features)))
        yield image_features[index], text_features[index], index, no_skips()


def brute_force_recall(similarity, k):
    """Fraction of rows whose own column is among the k most similar (a plain loop)."""
    hits = 0
    for row in range(len(similarity)):
        num_better = sum(1 for col in range(len(similarity)) if similarity[row, col] > similarity[row, row])
        hits += num_better < k
    return hits / len(similarity)


def brute_force_clip_loss(image_features, text_features, logit_scale, batch_size):
    """Per-batch symmetric cross-entropy with the diagonal as targets, averaged over samples."""
    total = 0.0
    for start in range(0, len(image_features), batch_size):
        x = F.normalize(image_features[start : start + batch_size], dim=-1).double()
        y = F.normalize(text_features[start : start + batch_size], dim=-1).double()
        logits = logit_scale * x @ y.T
        for i in range(len(x)):
            total += 0.5 * (torch.logsumexp(logits[i], 0) - logits[i, i]).item()
            total += 0.5 * (torch.logsumexp(logits[:, i], 0) - logits[i, i]).item()
    return total / len(image_features)


def test_run_validation_matches_brute_force():
    generator = torch.Generator().manual_seed(0)
    num_samples, dim, batch_size, logit_scale = 53, 8, 16, 10.0
    image_features = torch.randn(num_samples, dim, generator=generator)
    # Texts correlated with their image so recall lies strictly between chance and 1.
    text_features = image_features + 1.5 * torch.randn(num_samples, dim, generator=generator)
    metrics = run_validation(
        FeatureClip(logit_scale),
        list(feature_batches(image_features, text_features, batch_size)),
        device="cpu",
        epoch=1,
    )
    similarity = F.normalize(image_features, dim=-1) @ F.normalize(text_features, dim=-1).T
    assert metrics["num_samples"] == num_samples
    for k in (1, 5, 10):
        assert metrics[f"image_to_text_R@{k}"] == pytest.approx(brute_force_recall(similarity, k))
        assert metrics[f"text_to_image_R@{k}"] == pytest.approx(brute_force_recall(similarity.T, k))
    assert 0.0 < metrics["image_to_text_R@1"] < metrics["image_to_text_R@10"] < 1.0
    expected_loss = brute_force_clip_loss(image_features, text_features, logit_scale, batch_size)
    assert metrics["clip_val_loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_run_validation_on_tiny_clip_accepts_tuple_outputs():
    model = open_clip.create_model("adacl-tiny", output_dict=False)
    generator = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.rand(6, 3, 32, 32, generator=generator),
            torch.randint(1, 400, (6, 24), generator=generator),
            torch.arange(6) + 6 * b,
            torch.zeros(2, dtype=torch.long),
        )
        for b in range(2)
    ]
    metrics = run_validation(model, batches, device="cpu", epoch=3)
    assert metrics["num_samples"] == 12
    assert all(isinstance(value, float) and math.isfinite(value) for value in metrics.values())
    assert 0.0 <= metrics["text_to_image_R@1"] <= metrics["text_to_image_R@10"] <= 1.0


COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


class ColorClip(torch.nn.Module):
    """Encodes an image as its mean colour and the token id k as the k-th colour axis."""

    def encode_image(self, image, normalize=False):
        features = image.mean(dim=(2, 3))
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, text, normalize=False):
        features = F.one_hot(text[:, 0], num_classes=3).float()
        return F.normalize(features, dim=-1) if normalize else features


def write_fake_image_folder(root, layout):
    """root/<folder>/<i>.png, one solid image per colour listed under that folder."""
    for folder, colors in layout.items():
        (root / folder).mkdir(parents=True)
        for i, color in enumerate(colors):
            Image.new("RGB", (8, 8), COLORS[color]).save(root / folder / f"{i}.png")


def test_zero_shot_on_fake_image_folder_has_the_known_accuracy(tmp_path):
    # Folders sort as n0 < n1 < n2 (synset-like ids), named by the classnames list in that order.
    write_fake_image_folder(
        tmp_path,
        {
            "n0": ["red", "red", "blue"],  # one image in the wrong folder
            "n1": ["green", "green"],
            "n2": ["blue", "blue", "blue"],
        },
    )
    classnames = ["red", "green", "blue"]

    def tokenizer(texts):
        return torch.tensor([[classnames.index(text.split()[-1])] for text in texts])

    metrics = zero_shot_imagenet(
        ColorClip(),
        tokenizer,
        imagenet_folder(tmp_path, to_tensor, num_classes=3),
        device="cpu",
        batch_size=3,
        classnames=classnames,
        templates=["a photo of {}", "a drawing of {}"],
    )
    assert metrics == {"imagenet-zeroshot-val-top1": pytest.approx(7 / 8)}


def test_zero_shot_with_open_clip_model_and_tokenizer(tmp_path):
    write_fake_image_folder(
        tmp_path, {f"n{c}": [color] * 2 for c, color in enumerate(["red", "green", "blue", "red", "green", "blue"])}
    )
    model, _, preprocess = open_clip.create_model_and_transforms("adacl-tiny")
    classnames = ["red", "green", "blue", "cyan", "magenta", "yellow"]
    metrics = zero_shot_imagenet(
        model,
        open_clip.get_tokenizer("adacl-tiny"),
        imagenet_folder(tmp_path, preprocess, num_classes=6),
        device="cpu",
        batch_size=4,
        classnames=classnames,
        templates=["a photo of a {}."],
    )
    assert set(metrics) == {"imagenet-zeroshot-val-top1", "imagenet-zeroshot-val-top5"}
    assert 0.0 <= metrics["imagenet-zeroshot-val-top1"] <= metrics["imagenet-zeroshot-val-top5"] <= 1.0


def test_zero_shot_refuses_mismatched_classnames(tmp_path):
    write_fake_image_folder(tmp_path, {"n0": ["red"], "n1": ["blue"]})
    with pytest.raises(ValueError, match="2 class folders but 3 class names"):
        zero_shot_imagenet(
            ColorClip(),
            None,
            imagenet_folder(tmp_path, to_tensor, num_classes=2),
            device="cpu",
            classnames=["a", "b", "c"],
        )


def test_imagenet_folder_names_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="is not a directory; pass ImageNet's val set as one folder per class"):
        imagenet_folder(tmp_path / "missing")
    write_fake_image_folder(tmp_path / "three", {"n0": ["red"], "n1": ["blue"], "n2": ["green"]})
    with pytest.raises(ValueError, match="has 3 class folders, expected 1000"):
        imagenet_folder(tmp_path / "three")
    (tmp_path / "three" / "n3").mkdir()
    with pytest.raises(ValueError, match="Found no valid file for the classes n3"):
        imagenet_folder(tmp_path / "three", num_classes=4)
    (tmp_path / "three" / "n3").rmdir()
    assert imagenet_folder(tmp_path / "three", num_classes=3).classes == ["n0", "n1", "n2"]


def test_write_results_appends_one_line_per_epoch(tmp_path):
    path = tmp_path / "run" / "results.jsonl"
    write_results(path, epoch_results(1, {}, {"clip_val_loss": 2.5, "num_samples": 8}))
    write_results(path, epoch_results(2, {}, {"clip_val_loss": 2.0, "num_samples": 8}))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"clip_val_loss": 2.5, "epoch": 1, "num_samples": 8},
        {"clip_val_loss": 2.0, "epoch": 2, "num_samples": 8},
    ]


def test_an_epochs_results_are_in_openclips_order_and_line():
    """open_clip_train/train.py 3.3.0, `evaluate`: `metrics.update(zero_shot_metrics)`, then `{**val_metrics,
    "clip_val_loss": ..., "epoch": epoch, "num_samples": ...}`, logged as `f"Eval Epoch: {epoch} " + "\\t".join(
    f"{k}: {round(v, 4):.4f}" ...)`; our extra comes last."""
    validation = {"image_to_text_R@1": 0.25, "clip_val_loss": 2.0, "num_samples": 8, "clip_val_loss_chance": 2.08}
    results = epoch_results(3, {"imagenet-zeroshot-val-top1": 0.125}, validation)
    assert list(results) == [
        "imagenet-zeroshot-val-top1",
        "image_to_text_R@1",
        "clip_val_loss",
        "epoch",
        "num_samples",
        "clip_val_loss_chance",
    ]
    assert eval_line(results) == (
        "Eval Epoch: 3 imagenet-zeroshot-val-top1: 0.1250\timage_to_text_R@1: 0.2500\tclip_val_loss: 2.0000\t"
        "epoch: 3.0000\tnum_samples: 8.0000\tclip_val_loss_chance: 2.0800"
    )
    assert dashboard_values(results)["val/image_to_text_R@1"] == 0.25
    assert list(epoch_results(3, {"imagenet-zeroshot-val-top1": 0.125}, {})) == ["imagenet-zeroshot-val-top1", "epoch"]
