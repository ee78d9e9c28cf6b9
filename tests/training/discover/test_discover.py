"""`python -m training.discover`: the report on data with known families (every image on the page loads),
resuming after SIGKILL without losing or repeating a pair, 2 gloo ranks flagging what 1 rank flags, and
one-line errors for bad input."""

import json
import os
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import open_clip
import pytest
import torch

from helpers import REPO
from helpers.data_utils import good, png, write_tar
from helpers.distributed_utils import run_on_ranks
from helpers.run_utils import tiny_argv
from training.discover import main
from training.discover.cli import _Progress, planned_samples
from training.discover.store import BATCHES_FILE, PAIRS_FILE
from training.main import main as train_main
from training.synthetic_scenes.writers import write_demo_dataset
from training.trainer.data import DataError
from training.trainer.distributed import DistributedEnv

FAMILY = 8
SIGNALS = "text,tokens,gda_both"  # a feature, a token and a posterior signal
SRC = REPO / "src"


@pytest.fixture(scope="module")
def family_data(module_tmp):
    """192 demo scenes in families of 8 one-edit siblings (json "family", "family_edit"), 3 shards."""
    root = module_tmp("families")
    write_demo_dataset(root, seed=1, num_train=192, num_val=8, num_test=8, shard_size=64, family_size=FAMILY)
    return str(root / "train" / "shard-{000000..000002}.tar")


@pytest.fixture(scope="module")
def checkpoint(family_data, module_tmp):
    """epoch_1.pt of 3 AdaCL steps on the family data, trained with the 'gda' candidate region."""
    logs = module_tmp("logs")
    summary = train_main(
        tiny_argv(
            logs,
            "tiny",
            *("--loss", "adacl", "--adacl-candidate-region", "gda", "--lr", "1e-3"),
            data=family_data,
            batch_size=64,
        )
    )
    return summary.checkpoint


@pytest.fixture(scope="module")
def weights(module_tmp):
    """A randomly initialised adacl-tiny state dict, the same in every process that loads it."""
    torch.manual_seed(0)
    path = module_tmp("weights") / "tiny.pt"
    torch.save(open_clip.create_model("adacl-tiny").state_dict(), path)
    return str(path)


def run(data, output, *extra, model=("--model", "adacl-tiny")):
    return main([*model, "--data", data, "--output", str(output), "--device", "cpu", "--workers", "0", *extra])


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


class _Sources(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.pair_rows = [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img" and "src" in attrs:  # the enlarged view's img gets its src when a thumbnail is clicked
            self.images.append(attrs["src"])
        if tag == "tr" and "data-posterior" in attrs:
            self.pair_rows += 1


def page_sources(output):
    parser = _Sources()
    parser.feed((Path(output) / "index.html").read_text())
    return parser


@pytest.mark.slow
def test_report_on_family_data(family_data, checkpoint, tmp_path, capsys):
    output = tmp_path / "report"
    summary = run(
        family_data,
        output,
        "--batch-size",
        "32",
        "--page-pairs",
        "10",
        "--pairs-per-row",
        "2",
        model=("--checkpoint", checkpoint),
    )
    # The checkpoint's own discovery options; batches of 32 hold 4 whole families: 7 siblings of 31 negatives.
    assert summary["settings"]["candidate_region"] == "gda"
    assert summary["batches"] == 6 and summary["samples"] == 192
    both = summary["directions"]["both"]
    assert both["sibling_fraction"] == pytest.approx(7 / 31)
    assert both["negatives"] == 2 * 192 * 31
    assert 0 < both["flagged"] <= both["negatives"]
    assert 0 <= both["family_precision"] <= 1 and 0 <= both["family_recall"] <= 1
    assert both["candidates_per_row"] == pytest.approx(both["flagged"] / (2 * 192))
    table = capsys.readouterr().out
    assert "family precision*" in table and "sibling rate" in table and f"{both['family_precision']:.3f}" in table
    assert "precision against the data's families, a proxy" in table

    pairs = lines(output / PAIRS_FILE)
    assert len(pairs) == both["kept_pairs"] > 0
    per_row = {}
    for pair in pairs:
        key = (pair["batch"], pair["direction"], pair["query_index"])
        per_row[key] = per_row.get(key, 0) + 1
        assert pair["same_family"] == (pair["query_family"] == pair["negative_family"])
        assert pair["query_key"] != pair["negative_key"]
    assert max(per_row.values()) <= 2
    assert both["kept_family_precision"] == pytest.approx(sum(p["same_family"] for p in pairs) / len(pairs))
    # other-family pairs whose captions state the same facts are counted apart, as clones
    paraphrases = [p for p in pairs if not p["same_family"] and p["same_facts"]]
    assert both["kept_family_precision_with_paraphrases"] == pytest.approx(
        (sum(p["same_family"] for p in pairs) + len(paraphrases)) / len(pairs)
    )
    assert both["family_precision_with_paraphrases"] == pytest.approx(
        both["family_precision"] + both["paraphrases"] / both["flagged"]
    )
    # every kept pair's facts are counted (the demo's two-object scenes), 0 apart exactly when they are the same
    assert all(p["facts_apart"] == 0 if p["same_facts"] else p["facts_apart"] >= 1 for p in pairs)
    assert sum(both["kept_labels"].values()) == len(pairs)
    assert both["kept_labels"].get("paraphrase", 0) == len(paraphrases)
    assert both["kept_labels"].get("sibling-1", 0) + both["kept_labels"].get("sibling-2", 0) == sum(
        p["same_family"] for p in pairs
    )  # siblings of two-object scenes are 1 or 2 facts apart
    assert both["kept_within_one_fact"] == pytest.approx(sum(p["facts_apart"] <= 1 for p in pairs) / len(pairs))

    page = page_sources(output)
    assert 0 < page.pair_rows <= 20
    assert "plots/fits.png" in page.images and "plots/flagged.png" in page.images
    for source in page.images:
        assert (output / source).is_file(), source
    thumbs = {f"thumbs/{path.name}" for path in (output / "thumbs").iterdir()}
    assert thumbs == {source for source in page.images if source.startswith("thumbs/")}
    assert json.loads((output / "summary.json").read_text())["directions"]["both"] == both


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_repeats_no_pair(family_data, weights, tmp_path):
    flags = ["--pretrained", weights, "--batch-size", "4", "--page-pairs", "5"]
    expected = tmp_path / "uninterrupted"
    run(family_data, expected, *flags)
    output = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "training.discover",
        "--model",
        "adacl-tiny",
        "--data",
        family_data,
        "--output",
        str(output),
        "--device",
        "cpu",
        "--workers",
        "0",
        *flags,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not ((output / BATCHES_FILE).is_file() and len((output / BATCHES_FILE).read_bytes().splitlines()) >= 3):
            assert process.poll() is None and time.time() < deadline, "the run ended before it could be killed"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    done = len(lines(output / BATCHES_FILE))
    assert 3 <= done < 48 and not (output / "summary.json").exists()
    # As if killed in the middle of writing both files.
    with open(output / PAIRS_FILE, "a") as file:
        file.write('{"batch": 99, "direction": "i2t", "posterior": 0.')
    with open(output / BATCHES_FILE, "a") as file:
        file.write('{"batch": 99, "rows"')

    summary = run(family_data, output, *flags, "--continue")
    assert (output / PAIRS_FILE).read_text() == (expected / PAIRS_FILE).read_text()
    assert [record["batch"] for record in lines(output / BATCHES_FILE)] == list(range(48))
    assert summary["samples"] == 192 and summary["this_run"]["samples"] == 192 - 4 * done
    assert (output / "index.html").read_text() == (expected / "index.html").read_text()
    for source in page_sources(output).images:
        assert (output / source).is_file(), source


def _damaged_shards(directory):
    """Two shards of 40 samples, with a bad image, an empty caption and a duplicate key in between."""
    directory.mkdir()
    samples = [good(key) for key in range(80)]
    for key in range(80):
        samples[key]["png"] = png(colour=(key * 3 % 256, key * 7 % 256, key * 11 % 256))
        samples[key]["txt"] = f"a shape of colour {key % 13} number {key % 5}".encode()
    samples[13]["png"] = b"not an image"  # rank 1's slice of batch 0 at batch size 8 x 2
    samples[50]["txt"] = b"  "
    write_tar(directory / "a.tar", samples[:40] + [samples[39]])  # the duplicate is dropped when read
    write_tar(directory / "b.tar", samples[40:])
    return f"{directory}/a.tar::{directory}/b.tar"


def _discover_on_rank(rank, world_size, data, output, weights):
    return main(
        [
            "--model",
            "adacl-tiny",
            "--pretrained",
            weights,
            "--data",
            data,
            "--output",
            output,
            "--device",
            "cpu",
            "--workers",
            "0",
            "--batch-size",
            "8",
            "--adacl-salient",
            "mean",
            "--clone-signals",
            SIGNALS,
        ]
    )


@pytest.mark.slow
def test_two_ranks_flag_the_pairs_one_rank_flags(tmp_path, weights):
    data = _damaged_shards(tmp_path / "shards")
    # One rank with 2 data workers (each takes every other batch), 2 ranks reading in their main process.
    one = run(
        data,
        tmp_path / "one",
        "--pretrained",
        weights,
        "--batch-size",
        "16",
        "--adacl-salient",
        "mean",
        "--workers",
        "2",
        "--clone-signals",
        SIGNALS,
    )
    assert one["skipped"] == {"bad_image": 1, "empty_caption": 1, "duplicate_key": 1}
    two = run_on_ranks(_discover_on_rank, 2, data, str(tmp_path / "two"), weights, init_group=False)
    assert two[1] == {} and two[0]["skipped"] == one["skipped"] and two[0]["samples"] == one["samples"] == 78
    assert two[0]["settings"]["global_batch_size"] == 16
    expected, got = lines(tmp_path / "one" / PAIRS_FILE), lines(tmp_path / "two" / PAIRS_FILE)
    assert len(got) == len(expected) > 0
    for pair, reference in zip(got, expected):
        for name, value in reference.items():
            assert pair[name] == (pytest.approx(value, abs=1e-5) if isinstance(value, float) else value), name
    for record, reference in zip(lines(tmp_path / "two" / BATCHES_FILE), lines(tmp_path / "one" / BATCHES_FILE)):
        assert [d["flagged"] for d in record["directions"]] == [d["flagged"] for d in reference["directions"]]
        # the other signals too, the token ids gathered from slices of unequal lengths
        assert [d["signals"] for d in record["directions"]] == [d["signals"] for d in reference["directions"]]
        assert all(d["signals"]["text"]["flagged"] > 0 for d in record["directions"])


@pytest.mark.slow
def test_other_clone_signals_are_counted_against_the_families(family_data, checkpoint, tmp_path, capsys):
    summary = run(
        family_data,
        tmp_path / "report",
        "--batch-size",
        "32",
        "--clone-signals",
        "text,text_image_tokens",
        model=("--checkpoint", checkpoint),
    )
    both, table = summary["directions"]["both"], capsys.readouterr().out
    records = lines(tmp_path / "report" / BATCHES_FILE)
    for name in ("text", "text_image_tokens"):
        flagged = sum(d["signals"][name]["flagged"] for r in records for d in r["directions"])
        siblings = sum(d["signals"][name]["flagged_siblings"] for r in records for d in r["directions"])
        assert 0 < siblings <= flagged
        assert both["signals"][name] == {
            "flagged_fraction": pytest.approx(flagged / both["negatives"]),
            "family_precision": pytest.approx(siblings / flagged),
            "family_recall": pytest.approx(siblings / (both["sibling_fraction"] * both["negatives"])),
        }
        assert f"clone signal {name} (both directions): flagged {flagged / both['negatives']:.3f}" in table
    with pytest.raises(ValueError, match="--clone-signals: unknown nope; choose from gda, gda_both"):
        run(family_data, tmp_path / "bad", "--clone-signals", "text,nope", model=("--checkpoint", checkpoint))


def test_a_checkpoint_of_another_architecture_is_one_line(family_data, weights, checkpoint, tmp_path):
    state = torch.load(weights)
    state["text_projection"] = state["text_projection"][:, :8]
    del state["logit_scale"]
    wrong = tmp_path / "wrong.pt"
    torch.save(state, wrong)
    with pytest.raises(
        ValueError,
        match=r"does not fit --model adacl-tiny: 1 of \d+ tensors differ in shape and 1 "
        r"are missing, e\.g\. text_projection .*pass the --model it was trained as",
    ):
        run(family_data, tmp_path / "out", "--pretrained", str(wrong))
    with pytest.raises(ValueError, match="was trained as --model adacl-tiny but --model is ViT-B-32: drop --model"):
        run(family_data, tmp_path / "out", model=("--checkpoint", checkpoint, "--model", "ViT-B-32"))


def test_a_checkpoint_whose_contents_do_not_match_its_digest_is_one_line(family_data, checkpoint, tmp_path):
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    saved["state_dict"]["logit_scale"] += 1  # changed after the digest was taken, as a bad copy would
    damaged = tmp_path / "damaged.pt"
    torch.save(saved, damaged)
    with pytest.raises(
        ValueError,
        match=rf"^--checkpoint {damaged}: its contents do not match the digest written "
        "with it .*; copy it again from where it was written, or pass another",
    ):
        run(family_data, tmp_path / "out", model=("--checkpoint", str(damaged)))


@pytest.mark.slow
def test_unusable_shards_and_captions_are_one_line(family_data, weights, tmp_path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="none of the 1 shards given by --data can be read as a tar"):
        run(str(empty), tmp_path / "out", "--pretrained", weights)
    with pytest.raises(FileNotFoundError, match="do not exist"):
        run(str(tmp_path / "missing-{0..1}.tar"), tmp_path / "out", "--pretrained", weights)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.discover",
            "--model",
            "adacl-tiny",
            "--data",
            family_data,
            "--caption-key",
            "caption",
            "--output",
            str(tmp_path / "out"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "error: --caption-key caption: none of the first 64 samples of --data has a field 'caption'"
    )
    assert "pass --caption-key with one of ['txt', 'txt_alt', 'txt_pseudo']" in result.stderr


def test_every_registered_source_is_read_by_its_ordered_pass(tmp_path):
    """synthetic, which makes its own samples: --train-num-samples of them, no --data."""
    summary = main(
        [
            "--model",
            "adacl-tiny",
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "24",
            "--batch-size",
            "16",
            "--output",
            str(tmp_path / "out"),
            "--device",
            "cpu",
            "--workers",
            "0",
        ]
    )
    assert summary["samples"] == 24 and summary["batches"] == 2 and summary["settings"]["data"] is None
    with pytest.raises(ValueError, match="--data is required"):
        main(["--model", "adacl-tiny", "--output", str(tmp_path / "none"), "--device", "cpu"])


def test_csv_data_is_read_with_the_trainers_flags(tmp_path, weights):
    rows = ["path\tcaption"]
    for index in range(20):
        image = tmp_path / f"{index}.png"
        image.write_bytes(png(colour=(index * 12, 255 - index * 12, 90)))
        rows.append(f"{image}\ta square of shade {index % 4}")
    rows.insert(5, f"{tmp_path / 'missing.png'}\ta square that is not there")
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    summary = run(
        str(tmp_path / "data.csv"),
        tmp_path / "out",
        "--pretrained",
        weights,
        "--batch-size",
        "7",
        "--csv-img-key",
        "path",
        "--csv-caption-key",
        "caption",
    )
    assert summary["samples"] == 20 and summary["skipped"] == {"missing_image": 1} and summary["batches"] == 3
    assert "family_precision" not in summary["directions"]["both"]  # no ground-truth families
    pairs = lines(tmp_path / "out" / PAIRS_FILE)
    assert pairs and all(
        Path(pair["query_key"]).is_file() and pair["query_source"].endswith("data.csv") for pair in pairs
    )
    for source in page_sources(tmp_path / "out").images:
        assert (tmp_path / "out" / source).is_file(), source


def test_the_progress_bar_and_its_estimate_end_where_max_batches_stops():
    assert planned_samples(4096, None, 64) == 4096
    assert planned_samples(4096, 10, 64) == 640 and planned_samples(300, 10, 64) == 300
    assert planned_samples(None, 10, 64) == 640 and planned_samples(None, None, 64) is None
    progress = _Progress(DistributedEnv(), planned_samples(4096, 4, 64), done=64)  # resumed after batch 0
    assert progress.bar.total == 256
    batch = type("Batch", (), {"index": 1, "rows": 60, "raw_samples": 64})()
    progress.update(batch)
    line = progress.line(batch.index, now=progress.start + 10)
    assert line == "batch 1: 60 samples, 6.0 samples/s, 128/256 read, ETA 20 s"
    progress.close()
