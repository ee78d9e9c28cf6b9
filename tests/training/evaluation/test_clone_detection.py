"""`training.evaluation.clone_detection`: the loss's discovery step scored against known sibling families."""

import io
import json

import open_clip
import pytest
import torch
import webdataset as wds
from PIL import Image

from training.evaluation.clone_detection import detection_counts, evaluate_clone_detection, family_batches

FAMILY = 4
N = 16


def _family_similarities(noise=0.02, seed=0):
    """Positives at 0.9, siblings at 0.6, other negatives at 0.1 (+ noise): an easy batch."""
    g = torch.Generator().manual_seed(seed)
    families = torch.arange(N) // FAMILY
    siblings = families[:, None] == families[None, :]
    s = torch.where(siblings, 0.6, 0.1) + noise * torch.randn(N, N, generator=g, dtype=torch.float64)
    s.fill_diagonal_(0.9)
    # One query whose positive barely stands out (least salient: its negatives define "clone").
    s[0, 1] = 0.89
    return s, siblings


def test_counts_on_a_separable_batch():
    s, siblings = _family_similarities()
    for region in ("gda", "upper"):
        flagged, hits, true, negatives = detection_counts(s, siblings, salient="max", region=region).tolist()
        assert negatives == N * (N - 1)
        assert true == N * (FAMILY - 1)
        assert hits <= min(flagged, true)
    flagged, hits, true, _ = detection_counts(s, siblings, salient="max", region="upper").tolist()
    assert hits == true and flagged == hits  # every sibling found, nothing else flagged


def _write_family_shard(path, num_families, captions, with_family=True):
    with wds.TarWriter(str(path)) as sink:
        for index in range(num_families * FAMILY):
            image = Image.new("RGB", (32, 32), color=(index * 7 % 256, index * 13 % 256, 90))
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            meta = {"family": index // FAMILY} if with_family else {}
            sink.write(
                {
                    "__key__": f"{index:06d}",
                    "png": buffer.getvalue(),
                    "txt": captions(index),
                    "json": json.dumps(meta).encode(),
                }
            )


def test_evaluate_on_real_shards_reports_every_pair_and_the_exact_sibling_fraction(tmp_path):
    shard = tmp_path / "train-000000.tar"
    _write_family_shard(shard, 6, lambda i: f"a red circle number {i // FAMILY}")
    model, _, preprocess = open_clip.create_model_and_transforms("adacl-tiny")
    tokenizer = open_clip.get_tokenizer("adacl-tiny")
    metrics = evaluate_clone_detection(model, preprocess, tokenizer, [str(shard)], batch_size=8, num_batches=3)
    assert metrics["sibling_fraction"] == pytest.approx((FAMILY - 1) / 7)
    for salient in ("max", "mean"):
        for region in ("gda", "upper"):
            for name in ("precision", "recall", "flagged"):
                assert 0.0 <= metrics[f"{salient}-{region}/{name}"] <= 1.0


def test_batches_without_family_ids_are_refused(tmp_path):
    shard = tmp_path / "plain.tar"
    _write_family_shard(shard, 1, lambda i: "a caption", with_family=False)
    with pytest.raises(ValueError, match="family"):
        next(family_batches([str(shard)], 1, 1))
