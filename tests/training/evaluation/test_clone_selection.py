"""Clone-negative selection: the metric on hand-built numbers, a known-answer model, clip-benchmark agreement."""

import json
import math

import open_clip
import pytest
import torch
import webdataset as wds
from clip_benchmark.metrics import image_caption_selection
from PIL import Image
from torchvision.transforms.functional import to_tensor

import open_clip_adacl  # noqa: F401  (registers adacl-tiny)
from training.evaluation.clone_selection import (
    FAMILY,
    FAMILY_MARK,
    FAMILY_WITHOUT_MARK,
    clone_selection_accuracy,
    clone_selection_margins,
    evaluate_clone_selection,
    family_groups,
    read_clone_selection,
)

NAN = float("nan")
COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
VOCABULARY = ["<pad>", *COLORS, "circle", "square", "small", "big", "left", "of", "a"]


HAND_TRUE = torch.tensor([0.9, 0.5, 0.2])
HAND_CLONES = {
    "color": torch.tensor([0.1, 0.6, NAN]),  # 1 of 2 present pairs won
    "shape": torch.tensor([0.95, 0.1, 0.1]),  # 2 of 3
    "relation": torch.tensor([NAN, NAN, 0.2]),  # an exact tie is a failure
}


def test_accuracy_per_edit_type_and_pooled():
    metrics = clone_selection_accuracy(HAND_TRUE, HAND_CLONES)
    assert metrics == {
        "color_acc": 0.5,
        "shape_acc": pytest.approx(2 / 3),
        "relation_acc": 0.0,
        "overall_acc": pytest.approx(3 / 6),
    }


def test_margin_per_edit_type_and_pooled_in_cosine_units_logits_and_lower_tail():
    metrics = clone_selection_margins(HAND_TRUE, HAND_CLONES, logit_scale=10.0)
    # true - clone over the present pairs: color (0.8, -0.1), shape (-0.05, 0.4, 0.1), relation (0)
    assert {key: value for key, value in metrics.items() if key.endswith("_cos_margin")} == {
        "color_cos_margin": pytest.approx(0.35),
        "shape_cos_margin": pytest.approx(0.15),
        "relation_cos_margin": pytest.approx(0.0),
        "overall_cos_margin": pytest.approx(1.15 / 6),
    }
    # logits: logit_scale x the cosine margin
    assert {key: value for key, value in metrics.items() if key.endswith("_margin") and "_cos" not in key} == {
        "color_margin": pytest.approx(3.5),
        "shape_margin": pytest.approx(1.5),
        "relation_margin": pytest.approx(0.0),
        "overall_margin": pytest.approx(11.5 / 6),
    }
    # 10th percentile, linear between order statistics: color -0.1 + 0.1 x (0.8 + 0.1) = -0.01;
    # shape: position 0.2 of (-0.05, 0.1, 0.4) -> -0.05 + 0.2 x 0.15 = -0.02; overall: position 0.5 of
    # (-0.1, -0.05, 0, 0.1, 0.4, 0.8) -> -0.075
    assert metrics["color_cos_margin_p10"] == pytest.approx(-0.01, abs=1e-6)  # float32 inputs
    assert metrics["shape_cos_margin_p10"] == pytest.approx(-0.02, abs=1e-6)
    assert metrics["relation_cos_margin_p10"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["overall_cos_margin_p10"] == pytest.approx(-0.075, abs=1e-6)


def write_clone_shards(data_dir, samples, per_shard=2):
    """`<key>.png` + `<key>.json` {"caption", "clones"} samples in data_dir/<n>.tar, like training.synthetic_scenes.writers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(samples), per_shard):
        with wds.TarWriter(str(data_dir / f"{start // per_shard:06d}.tar")) as sink:
            for offset, (color, caption, clones) in enumerate(samples[start : start + per_shard]):
                sink.write(
                    {
                        "__key__": f"{start + offset:06d}",
                        "png": Image.new("RGB", (32, 32), COLORS[color]),
                        "json": json.dumps({"caption": caption, "clones": clones}).encode(),
                    }
                )


def word_tokenizer(texts):
    """Word ids padded to 6, a stand-in for open_clip's tokenizer."""
    rows = [[VOCABULARY.index(word) for word in text.split()] for text in texts]
    return torch.tensor([row + [0] * (6 - len(row)) for row in rows])


class ColorOnlyClip(torch.nn.Module):
    """Sees only colour: an image is its mean colour, a caption the colour words it names."""

    def __init__(self):
        super().__init__()
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(10.0)))  # OpenCLIP's parametrisation

    def encode_image(self, image):
        return image.mean(dim=(2, 3))

    def encode_text(self, text):
        color_ids = torch.arange(1, 1 + len(COLORS))
        return (text[:, :, None] == color_ids).float().sum(dim=1) + 1e-3


COLOR_BLIND_SAMPLES = [
    ("red", "a red circle", {"color": "a blue circle", "shape": "a red square", "relation": None}),
    ("green", "a green square", {"color": "a red square", "shape": "a green circle"}),
    ("blue", "a big blue circle", {"color": "a big green circle", "size": "a small blue circle"}),
    (
        "red",
        "a red circle left of a blue square",
        {"color": "a green circle left of a blue square", "relation": "a blue square left of a red circle"},
    ),
]


def test_known_answer_for_a_model_that_sees_only_colour(tmp_path):
    write_clone_shards(tmp_path, COLOR_BLIND_SAMPLES)
    assert [caption for _, caption, _ in read_clone_selection(tmp_path)] == [s[1] for s in COLOR_BLIND_SAMPLES]
    metrics = evaluate_clone_selection(ColorOnlyClip(), to_tensor, word_tokenizer, tmp_path, batch_size=3)
    # Colour edits are always caught; shape, size and relation edits leave the features tied: failures.
    assert metrics == {
        "color_acc": 1.0,
        "shape_acc": 0.0,
        "size_acc": 0.0,
        "relation_acc": 0.0,
        "overall_acc": pytest.approx(4 / 8),
    }
    with_margins = evaluate_clone_selection(
        ColorOnlyClip(), to_tensor, word_tokenizer, tmp_path, batch_size=3, margins=True
    )
    assert {key: value for key, value in with_margins.items() if key.endswith("_acc")} == metrics
    # Tied features give margin 0; a colour clone loses the whole cosine between distinct pure colours.
    assert with_margins["shape_margin"] == with_margins["size_margin"] == with_margins["relation_margin"] == 0.0
    assert with_margins["color_margin"] > 5.0  # of at most 10 x (1 - 0)
    assert with_margins["overall_margin"] == pytest.approx(with_margins["color_margin"] * 4 / 8)


def test_family_groups_split_the_siblings_by_kind():
    family = ["a with acute", "A", "a bold", "a with grave"]
    groups = family_groups(family, ["mark", "case", "weight", "mark"])
    assert groups == {
        FAMILY: family,
        FAMILY_WITHOUT_MARK: ["A", "a bold"],
        FAMILY_MARK: ["a with acute", "a with grave"],
    }
    assert family_groups(family, None) == {FAMILY: family}  # no kinds: the whole family only
    assert family_groups(["A"], ["case"]) == {FAMILY: ["A"], FAMILY_WITHOUT_MARK: ["A"]}
    with pytest.raises(ValueError, match="2 kinds for 4 siblings"):
        family_groups(family, ["mark", "case"])


def test_no_family_group_is_pooled():
    true = torch.tensor([0.5, 0.5])
    clones = {
        "mark": torch.tensor([0.4, 0.6]),
        FAMILY: torch.tensor([0.6, 0.6]),
        FAMILY_WITHOUT_MARK: torch.tensor([0.4, 0.4]),
        FAMILY_MARK: torch.tensor([0.6, 0.7]),
    }
    metrics = clone_selection_accuracy(true, clones)
    assert metrics["overall_acc"] == pytest.approx(1 / 2)
    assert metrics["family_without_mark_acc"] == 1.0 and metrics["family_mark_acc"] == 0.0
    margins = clone_selection_margins(true, clones, logit_scale=10.0)
    assert margins["overall_cos_margin"] == pytest.approx(0.0, abs=1e-6)  # the mark pairs' +0.1 and -0.1 only


def test_margins_need_a_logit_scale(tmp_path):
    write_clone_shards(tmp_path, COLOR_BLIND_SAMPLES)
    model = ColorOnlyClip()
    model.logit_scale = None
    with pytest.raises(ValueError, match="no logit_scale tensor.*margins=False"):
        evaluate_clone_selection(model, to_tensor, word_tokenizer, tmp_path, margins=True)


def test_agrees_with_clip_benchmark_image_caption_selection_on_the_demo_set(demo_shards):
    data_dir = demo_shards / "clone_selection"
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("adacl-tiny")
    tokenizer = open_clip.get_tokenizer("adacl-tiny")
    metrics = evaluate_clone_selection(model, preprocess, tokenizer, data_dir, batch_size=50, margins=True)

    samples = list(read_clone_selection(data_dir))
    edits = ("color", "shape", "size", "relation")
    assert set(metrics) == {
        f"{name}_{kind}" for name in (*edits, "overall") for kind in ("acc", "margin", "cos_margin", "cos_margin_p10")
    }
    for edit in edits:
        # clip-benchmark's loader format for SugarCrepe: (images, [[true caption, negative caption], ...])
        pairs = [(preprocess(image), [caption, clones[edit]]) for image, caption, clones in samples if edit in clones]
        images = torch.stack([image for image, _ in pairs])
        dataloader = [(images, [texts for _, texts in pairs])]
        reference = image_caption_selection.evaluate(model, dataloader, tokenizer, device="cpu", amp=False)
        assert metrics[f"{edit}_acc"] == pytest.approx(reference["text_acc"])
        # The margin from OpenCLIP's own forward: normalized features and exp(logit_scale).
        with torch.no_grad():
            image_features, true_features, scale = model(images, tokenizer([texts[0] for _, texts in pairs]))
            _, clone_features, _ = model(images, tokenizer([texts[1] for _, texts in pairs]))
        margin = scale * ((image_features * true_features).sum(-1) - (image_features * clone_features).sum(-1))
        assert metrics[f"{edit}_margin"] == pytest.approx(margin.mean().item(), abs=1e-4)
        assert metrics[f"{edit}_cos_margin_p10"] == pytest.approx((margin / scale).quantile(0.1).item(), abs=1e-5)
    assert 0.0 < metrics["overall_acc"] < 1.0


def test_warns_when_truncation_removes_the_edit(tmp_path):
    write_clone_shards(
        tmp_path, [("red", "a red circle left of a blue square", {"relation": "a red circle left of a blue circle"})]
    )

    def truncating_tokenizer(texts):
        return word_tokenizer(texts)[:, :4]

    with pytest.warns(UserWarning, match="1 clone captions tokenize exactly like their true caption"):
        metrics = evaluate_clone_selection(ColorOnlyClip(), to_tensor, truncating_tokenizer, tmp_path)
    assert metrics["relation_acc"] == 0.0


def test_missing_shards_are_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        evaluate_clone_selection(ColorOnlyClip(), to_tensor, word_tokenizer, tmp_path)
