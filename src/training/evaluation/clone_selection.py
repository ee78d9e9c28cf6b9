"""Clone-negative selection: does the model prefer an image's true caption over a one-edit clone of it?

The SugarCrepe idea on our scene generator: each held-out image comes with its true caption and,
per edit type (e.g. `color`, `shape`, `size`, `relation`), a clone caption that changes exactly
that detail. Accuracy for an edit type is the fraction of images (that have such a clone) where
cos(image, true caption) > cos(image, clone caption); `overall_acc` pools every (image, clone) pair.
With `margins=True` it also reports, per edit type and pooled (`overall`), the margin
cos(image, true) - cos(image, clone) over the images: its mean (`<edit>_cos_margin`) and its 10th
percentile (`<edit>_cos_margin_p10`, the lower tail: how the worst-handled tenth of the images
fares), in cosine units, comparable across models; and its mean in logits (`<edit>_margin`:
logit_scale x the cosine margin, as the model's softmax sees it; sigmoid of it is the model's
probability of the true caption against that clone alone). The margins keep measuring small
differences when accuracy saturates near 1 or sits at chance.

This is clip-benchmark's `image_caption_selection` metric (its `text_acc`, the one that matters
for one image and two captions), computed here because its loaders cannot read our data: the
`sugar_crepe/*` builder wants COCO's val2017 and SugarCrepe's own seven task names, and `wds/`
sets are classification or retrieval only. Two differences, both deliberate: the image and
every clone caption are encoded once for all edit types, and an exact tie counts as a failure
(clip-benchmark's argmax picks the first caption, the true one, on a tie; a tie only happens when
the tokenizer truncates the edit away, and then the model cannot tell the captions apart).

Family selection: a sample's json may also list its whole family of siblings (`"family": [caption, ...]`,
the glyph benchmark's, the lab's `studies.glyphs`); `family_acc` is then the fraction of images whose true caption
beats every sibling's (picking the true member among its family; chance is 1 / (siblings + 1)), and the
`family_*margin` metrics use the closest sibling. When the json also names each sibling's kind
(`"family_kinds"`, parallel to `"family"`), the same is reported over the siblings that are not of the
`mark` kind (`family_without_mark_*`: a glyph's diacritic-mark siblings differ by a few pixels, and every
loss sits near chance on them) and over the mark siblings alone (`family_mark_*`). The family groups are
kept out of the pooled `overall` metrics.

Data: a folder of webdataset shards (`*.tar`) of `<key>.png` + `<key>.json` with
`{"caption": str, "clones": {edit_type: str or null}, "family": [str, ...] (optional), "family_kinds": [str, ...]
(optional)}` (written by
`training.synthetic_scenes.writers` and `studies.glyphs.writers`).
"""

from __future__ import annotations

import warnings
from itertools import islice
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch
import webdataset as wds
from PIL import Image

# (image, true caption, {edit type: clone caption, FAMILY: [every sibling's caption]})
CloneSample = tuple[Image.Image, str, dict[str, "str | list[str]"]]
FAMILY = "family"  # the group of every sibling: its similarity is the closest sibling's
FAMILY_WITHOUT_MARK = "family_without_mark"  # the siblings of every kind but `mark`
FAMILY_MARK = "family_mark"  # the `mark` siblings alone
FAMILY_GROUPS = (FAMILY, FAMILY_WITHOUT_MARK, FAMILY_MARK)  # reported, never pooled into `overall`
MARK_KIND = "mark"


def family_groups(family: list[str], kinds: list[str] | None) -> dict[str, list[str]]:
    """FAMILY: every sibling's caption; with their kinds, also the non-mark and the mark siblings (a group
    only when it has a member)."""
    groups = {FAMILY: list(family)}
    if kinds is None:
        return groups
    if len(kinds) != len(family):
        raise ValueError(f"family_kinds lists {len(kinds)} kinds for {len(family)} siblings")
    for name, keep in ((FAMILY_WITHOUT_MARK, lambda kind: kind != MARK_KIND), (FAMILY_MARK, MARK_KIND.__eq__)):
        members = [caption for caption, kind in zip(family, kinds) if keep(kind)]
        if members:
            groups[name] = members
    return groups


def read_clone_selection(data_dir: str | Path) -> Iterator[CloneSample]:
    """Yield (image, true caption, {edit type: clone caption, and FAMILY: the family's captions when the sample
    lists them}) from the shards in `data_dir`, in order."""
    shards = sorted(str(path) for path in Path(data_dir).glob("*.tar"))
    if not shards:
        raise FileNotFoundError(f"no .tar shards in {data_dir}")
    dataset = wds.WebDataset(shards, shardshuffle=False).decode("pil").to_tuple("png", "json")
    for image, meta in dataset:
        clones = {edit: text for edit, text in meta["clones"].items() if text}
        if meta.get(FAMILY):
            clones.update(family_groups(meta[FAMILY], meta.get("family_kinds")))
        yield image, meta["caption"], clones


def clone_selection_accuracy(
    true_similarity: torch.Tensor, clone_similarity: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """Per-edit-type and pooled accuracy of preferring the true caption.

    true_similarity: (N,) cos(image i, true caption i).
    clone_similarity: edit type -> (N,) cos(image i, clone i of that type), NaN where image i has none.
    Returns `<edit>_acc` per edit type and `overall_acc` over all (image, clone) pairs (the FAMILY_GROUPS,
    the closest of a family, are reported but not pooled).
    """
    metrics, num_correct, num_pairs = {}, 0, 0
    for edit, similarity in sorted(clone_similarity.items()):
        present = ~similarity.isnan()
        correct = true_similarity[present] > similarity[present]
        metrics[f"{edit}_acc"] = correct.float().mean().item()
        if edit not in FAMILY_GROUPS:
            num_correct += int(correct.sum())
            num_pairs += int(present.sum())
    metrics["overall_acc"] = num_correct / num_pairs
    return metrics


MARGIN_QUANTILE = 0.1  # the lower tail reported besides the mean margin (`_cos_margin_p10`)


def clone_selection_margins(
    true_similarity: torch.Tensor, clone_similarity: Mapping[str, torch.Tensor], logit_scale: float
) -> dict[str, float]:
    """Per-edit-type and pooled margin of the true caption over its clone, cos(image, true) - cos(image, clone).

    Same inputs as `clone_selection_accuracy`, plus the model's logit scale (exp of its parameter).
    Returns, for each edit type and `overall` (all (image, clone) pairs): `_cos_margin` (mean, cosine
    units), `_cos_margin_p10` (10th percentile, linear interpolation) and `_margin` (mean in logits).
    """
    margins = {}
    for edit, similarity in sorted(clone_similarity.items()):
        present = ~similarity.isnan()
        margins[edit] = true_similarity[present].double() - similarity[present].double()
    margins["overall"] = torch.cat([margin for edit, margin in margins.items() if edit not in FAMILY_GROUPS])
    metrics = {}
    for name, margin in margins.items():
        metrics[f"{name}_cos_margin"] = margin.mean().item()
        metrics[f"{name}_cos_margin_p10"] = torch.quantile(margin, MARGIN_QUANTILE).item()
        metrics[f"{name}_margin"] = logit_scale * metrics[f"{name}_cos_margin"]
    return metrics


def model_logit_scale(model: torch.nn.Module) -> float:
    """exp(model.logit_scale), the scale OpenCLIP's CLIP multiplies cosines by to get logits."""
    logit_scale = getattr(model, "logit_scale", None)
    if not isinstance(logit_scale, torch.Tensor):
        raise ValueError(
            f"{type(model).__name__} has no logit_scale tensor (an OpenCLIP CLIP model has one): "
            "clone-selection margins include logit margins and need it; evaluate with margins=False"
        )
    return float(logit_scale.detach().exp())


def batches(samples: Iterator[CloneSample], batch_size: int) -> Iterator[list[CloneSample]]:
    while batch := list(islice(samples, batch_size)):
        yield batch


def encode_normalized(encode: Callable, inputs: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(encode(inputs).float(), dim=-1)


def clone_similarities(
    model: torch.nn.Module,
    preprocess: Callable,
    tokenizer: Callable,
    samples: Iterator[CloneSample],
    *,
    device: str | torch.device,
    batch_size: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(true_similarity (N,), {edit: (N,) with NaN where absent}) as `clone_selection_accuracy` takes them."""
    true_similarity, clone_pairs, num_images, num_ties = [], [], 0, 0
    model.eval()
    with torch.inference_mode():
        for batch in batches(samples, batch_size):
            images = torch.stack([preprocess(image) for image, _, _ in batch]).to(device)
            image_features = encode_normalized(model.encode_image, images)
            true_tokens = tokenizer([caption for _, caption, _ in batch]).to(device)
            true_features = encode_normalized(model.encode_text, true_tokens)
            true_similarity.append((image_features * true_features).sum(-1).cpu())
            # (row in batch, edit, clone caption) for every clone of every image, encoded in one call; a family
            # group contributes each of its captions, and the closest one counts
            clones = [
                (row, edit, text)
                for row, (_, _, edits) in enumerate(batch)
                for edit, texts in edits.items()
                for text in ([texts] if isinstance(texts, str) else texts)
            ]
            if clones:
                rows = torch.tensor([row for row, _, _ in clones], device=device)
                clone_tokens = tokenizer([text for _, _, text in clones]).to(device)
                clone_features = encode_normalized(model.encode_text, clone_tokens)
                similarity = (image_features[rows] * clone_features).sum(-1).cpu()
                num_ties += int((clone_tokens == true_tokens[rows]).all(dim=1).sum())
                clone_pairs += [
                    (num_images + row, edit, value) for (row, edit, _), value in zip(clones, similarity.tolist())
                ]
            num_images += len(batch)
    if num_ties:
        warnings.warn(
            f"{num_ties} clone captions tokenize exactly like their true caption (truncated at the "
            "model's context length); they count as failures"
        )
    clone_similarity: dict[str, torch.Tensor] = {}
    for index, edit, value in clone_pairs:
        column = clone_similarity.setdefault(edit, torch.full((num_images,), float("nan")))
        column[index] = value if column[index].isnan() else max(float(column[index]), value)
    return torch.cat(true_similarity), clone_similarity


def evaluate_clone_selection(
    model: torch.nn.Module,
    preprocess: Callable,
    tokenizer: Callable,
    data_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    batch_size: int = 64,
    margins: bool = False,
) -> dict[str, float]:
    """Clone-selection accuracy per edit type (`<edit>_acc`) and pooled (`overall_acc`) on `data_dir`'s shards;
    with `margins`, also the margins (`clone_selection_margins`: `<edit>_cos_margin`, `<edit>_cos_margin_p10`,
    `<edit>_margin`, and the same for `overall`)."""
    logit_scale = model_logit_scale(model) if margins else None  # fail before encoding anything
    true_similarity, clone_similarity = clone_similarities(
        model, preprocess, tokenizer, read_clone_selection(data_dir), device=device, batch_size=batch_size
    )
    metrics = clone_selection_accuracy(true_similarity, clone_similarity)
    if margins:
        metrics.update(clone_selection_margins(true_similarity, clone_similarity, logit_scale))
    return metrics
