"""`studies.signal_precision`: batches of whole families, the precision-recall curve, and a report whose
numbers are those of the flags it scored (on encoded samples made here, no training)."""

import pytest
import torch
import torch.nn.functional as F

from open_clip_adacl.clone_signals import SIGNALS
from studies import persistence, signal_precision


def test_batches_hold_whole_families_in_a_seeded_order(monkeypatch):
    bench = signal_precision
    family = torch.arange(80) // 8 * 3  # 10 families of 8, ids not consecutive
    batches = bench.training_batches(family, seed=1, limit=None)
    assert len(batches) == 1 and batches[0].numel() == 64  # 8 families a batch; the last 2 families make none
    assert all((family[b][:, None] == family[b][None, :]).sum() == 64 * 8 for b in batches)
    assert torch.equal(batches[0], bench.training_batches(family, seed=1, limit=None)[0])
    assert not torch.equal(batches[0], bench.training_batches(family, seed=2, limit=None)[0])
    [wide] = bench.training_batches(torch.arange(160) // 8, seed=1, limit=None, families_per_batch=16)
    assert wide.numel() == 128 and torch.unique(wide // 8).numel() == 16  # 16 of the 20 families, whole


def test_precision_recall_curve_by_hand(monkeypatch):
    bench = signal_precision
    score = torch.tensor([0.9, 0.8, 0.8, 0.1], dtype=torch.float64)
    sibling = torch.tensor([True, False, True, False])
    precision, recall, threshold = bench.precision_recall_curve(score, sibling)
    assert threshold.tolist() == [0.9, 0.8, 0.1]  # the tie at 0.8 is one cut
    assert precision.tolist() == [1.0, 2 / 3, 0.5] and recall.tolist() == [0.5, 1.0, 1.0]


def test_the_report_states_the_scored_flags(monkeypatch, tmp_path):
    bench = signal_precision
    g = torch.Generator().manual_seed(0)
    family = torch.arange(128) // 8
    centre = torch.randn(16, 8, generator=g)[family]
    image = F.normalize(centre + 0.4 * torch.randn(128, 8, generator=g), dim=-1)
    text = F.normalize(centre + 0.4 * torch.randn(128, 8, generator=g), dim=-1)
    tokens = torch.stack([torch.tensor([49406, 300 + int(f), 400 + int(i) % 3, 49407]) for i, f in enumerate(family)])
    encoded = bench.EncodedSamples(
        family,
        image,
        {key: text for key in bench.CELLS.values()},
        {key: tokens for key in bench.CELLS.values()},
        torch.tensor(14.3),
    )
    batches = bench.training_batches(family, 0, None)
    scored = bench.score_cell(encoded, "txt", batches, 1.5)
    assert set(scored) == set(SIGNALS)
    rows = {name: bench.signal_row(values) for name, values in scored.items()}
    text_row = rows["text"]
    flagged, sibling = scored["text"]["flagged"], scored["text"]["sibling"]
    assert text_row["precision"] == (flagged & sibling).sum().item() / flagged.sum().item()
    assert text_row["base_rate"] == pytest.approx(7 / 63)
    curves = {
        cell: {
            name: (*bench.precision_recall_curve(v["standardized"], v["sibling"])[:2], 7 / 63)
            for name, v in scored.items()
        }
        for cell in bench.CELLS
    }
    bench.write_report(
        {cell: rows for cell in bench.CELLS}, curves, tmp_path, "cmd", len(batches), 1.5, report_name="look"
    )
    report = (tmp_path / "look.md").read_text()
    assert f"| `text` | {text_row['flagged']:.3f} | **{text_row['precision']:.3f}** |" in report
    assert (tmp_path / "look_pr.png").stat().st_size > 0 and "[look_pr.png](look_pr.png)" in report
    lines = (tmp_path / "look_pr.csv").read_text().splitlines()
    assert lines[0] == "cell,signal,recall,precision" and len(lines) == 1 + 2 * len(SIGNALS) * 101


def test_the_persistence_replay_keys_the_memory_by_sample_ids_across_epochs(monkeypatch):
    bench = signal_precision
    g = torch.Generator().manual_seed(0)
    family = torch.arange(128) // 8  # 16 families: 2 batches an epoch
    centre = torch.randn(16, 8, generator=g)[family]

    def encoded(seed):  # the features move between checkpoints
        noise = torch.Generator().manual_seed(seed)
        image = F.normalize(centre + 0.8 * torch.randn(128, 8, generator=noise), dim=-1)
        text = F.normalize(centre + 0.8 * torch.randn(128, 8, generator=noise), dim=-1)
        tokens = torch.stack([torch.tensor([49406, 100 + int(f), 49407]) for f in family])
        return bench.EncodedSamples(family, image, {"txt": text}, {"txt": tokens}, torch.tensor(14.0))

    monkeypatch.setattr(bench, "encode_samples", lambda samples, checkpoint: encoded(int(checkpoint)))
    scored = persistence.replay(None, ["1", "2", "3"], momentum=0.5, threshold=1.5)
    negatives = 2 * 2 * 64 * 63  # the last epoch's 2 batches, both directions
    assert all(values["sibling"].numel() == negatives for values in scored.values())
    # the siblings met in every epoch: their persistence differs from this epoch's score alone
    assert not torch.equal(scored["persistence"]["score"], scored["features"]["standardized"])
    precision, recall = bench.precision_and_recall(scored["persistence"]["flagged"], scored["persistence"]["sibling"])
    assert precision > 0.5 and recall > 0.3
