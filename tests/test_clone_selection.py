"""Clone-negative selection: the metric on hand-built numbers, a known-answer model, clip-benchmark agreement."""
import json

import open_clip
import pytest
import torch
import webdataset as wds
from clip_benchmark.metrics import image_caption_selection
from PIL import Image
from torchvision.transforms.functional import to_tensor

import open_clip_adacl  # noqa: F401  (registers adacl-tiny)
from training.clone_selection import clone_selection_accuracy, evaluate_clone_selection, read_clone_selection

NAN = float("nan")
COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
VOCABULARY = ["<pad>", *COLORS, "circle", "square", "small", "big", "left", "of", "a"]


def test_accuracy_per_edit_type_and_pooled():
    true_similarity = torch.tensor([0.9, 0.5, 0.2])
    metrics = clone_selection_accuracy(true_similarity, {
        "color": torch.tensor([0.1, 0.6, NAN]),  # 1 of 2 present pairs won
        "shape": torch.tensor([0.95, 0.1, 0.1]),  # 2 of 3
        "relation": torch.tensor([NAN, NAN, 0.2]),  # an exact tie is a failure
    })
    assert metrics == {"color_acc": 0.5, "shape_acc": pytest.approx(2 / 3), "relation_acc": 0.0,
                       "overall_acc": pytest.approx(3 / 6)}


def write_clone_shards(data_dir, samples, per_shard=2):
    """`<key>.png` + `<key>.json` {"caption", "clones"} samples in data_dir/<n>.tar, like training.scenes."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(samples), per_shard):
        with wds.TarWriter(str(data_dir / f"{start // per_shard:06d}.tar")) as sink:
            for offset, (color, caption, clones) in enumerate(samples[start:start + per_shard]):
                sink.write({"__key__": f"{start + offset:06d}", "png": Image.new("RGB", (32, 32), COLORS[color]),
                            "json": json.dumps({"caption": caption, "clones": clones}).encode()})


def word_tokenizer(texts):
    """Word ids padded to 6, a stand-in for open_clip's tokenizer."""
    rows = [[VOCABULARY.index(word) for word in text.split()] for text in texts]
    return torch.tensor([row + [0] * (6 - len(row)) for row in rows])


class ColorOnlyClip(torch.nn.Module):
    """Sees only colour: an image is its mean colour, a caption the colour words it names."""

    def encode_image(self, image):
        return image.mean(dim=(2, 3))

    def encode_text(self, text):
        color_ids = torch.arange(1, 1 + len(COLORS))
        return (text[:, :, None] == color_ids).float().sum(dim=1) + 1e-3


COLOR_BLIND_SAMPLES = [
    ("red", "a red circle", {"color": "a blue circle", "shape": "a red square", "relation": None}),
    ("green", "a green square", {"color": "a red square", "shape": "a green circle"}),
    ("blue", "a big blue circle", {"color": "a big green circle", "size": "a small blue circle"}),
    ("red", "a red circle left of a blue square",
     {"color": "a green circle left of a blue square", "relation": "a blue square left of a red circle"}),
]


def test_known_answer_for_a_model_that_sees_only_colour(tmp_path):
    write_clone_shards(tmp_path, COLOR_BLIND_SAMPLES)
    assert [caption for _, caption, _ in read_clone_selection(tmp_path)] == [s[1] for s in COLOR_BLIND_SAMPLES]
    metrics = evaluate_clone_selection(ColorOnlyClip(), to_tensor, word_tokenizer, tmp_path, batch_size=3)
    # Colour edits are always caught; shape, size and relation edits leave the features tied: failures.
    assert metrics == {"color_acc": 1.0, "shape_acc": 0.0, "size_acc": 0.0, "relation_acc": 0.0,
                       "overall_acc": pytest.approx(4 / 8)}


def test_agrees_with_clip_benchmark_image_caption_selection_on_the_demo_set(demo_shards):
    data_dir = demo_shards / "clone_selection"
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("adacl-tiny")
    tokenizer = open_clip.get_tokenizer("adacl-tiny")
    metrics = evaluate_clone_selection(model, preprocess, tokenizer, data_dir, batch_size=50)

    samples = list(read_clone_selection(data_dir))
    assert set(metrics) == {"color_acc", "shape_acc", "size_acc", "relation_acc", "overall_acc"}
    for edit in ("color", "shape", "size", "relation"):
        # clip-benchmark's loader format for SugarCrepe: (images, [[true caption, negative caption], ...])
        pairs = [(preprocess(image), [caption, clones[edit]]) for image, caption, clones in samples if edit in clones]
        dataloader = [(torch.stack([image for image, _ in pairs]), [texts for _, texts in pairs])]
        reference = image_caption_selection.evaluate(model, dataloader, tokenizer, device="cpu", amp=False)
        assert metrics[f"{edit}_acc"] == pytest.approx(reference["text_acc"])
    assert 0.0 < metrics["overall_acc"] < 1.0


def test_warns_when_truncation_removes_the_edit(tmp_path):
    write_clone_shards(tmp_path, [("red", "a red circle left of a blue square",
                                   {"relation": "a red circle left of a blue circle"})])

    def truncating_tokenizer(texts):
        return word_tokenizer(texts)[:, :4]

    with pytest.warns(UserWarning, match="1 clone captions tokenize exactly like their true caption"):
        metrics = evaluate_clone_selection(ColorOnlyClip(), to_tensor, truncating_tokenizer, tmp_path)
    assert metrics["relation_acc"] == 0.0


def test_missing_shards_are_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        evaluate_clone_selection(ColorOnlyClip(), to_tensor, word_tokenizer, tmp_path)
