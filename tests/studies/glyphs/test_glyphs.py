"""The glyph benchmark's data: real DejaVu glyphs named by Unicode, families of one-attribute siblings, held-out
glyphs never trained on, weak captions, and the family accuracy its evaluation reports."""

import json

import numpy as np
import pytest
import torch
import webdataset as wds

from studies.glyphs import ATTRIBUTE_KINDS, FACES, SiblingIndex, all_glyphs, covered_letters, write_glyph_dataset
from studies.glyphs.catalogue import Glyph, parse_letter
from studies.glyphs.rendering import render_glyph
from studies.glyphs.writers import split_of, weak_caption
from training import RunDir
from training.evaluation.clone_selection import (
    FAMILY,
    FAMILY_GROUPS,
    FAMILY_MARK,
    FAMILY_WITHOUT_MARK,
    clone_selection_accuracy,
    read_clone_selection,
)
from training.main import main
from training.trainer.data.shard_writer import brace_pattern


@pytest.fixture(scope="module")
def glyph_data(module_tmp):
    root = module_tmp("glyphs") / "data"
    write_glyph_dataset(root, seed=0, num_train=256, shard_size=128)
    return root


def samples(pattern: str):
    import braceexpand

    return list(wds.WebDataset(list(braceexpand.braceexpand(pattern)), shardshuffle=False).decode())


def test_letters_are_parsed_from_their_unicode_names():
    letter = parse_letter(0x1EBF)  # LATIN SMALL LETTER E WITH CIRCUMFLEX AND ACUTE
    assert (letter.case, letter.base, letter.marks) == ("small", "e", "circumflex and acute")
    assert parse_letter(0x00C5).name == "latin capital letter a with ring above"
    assert parse_letter(0x0131) is None  # LATIN SMALL LETTER DOTLESS I: no one-letter base
    assert parse_letter(ord("?")) is None
    letters = covered_letters()
    assert len(letters) > 400 and len(FACES) == 12
    assert Glyph(letters[0], FACES[0]).caption.startswith("latin capital letter a, ")


def test_every_sibling_differs_in_exactly_its_attribute_kind():
    glyphs = all_glyphs()
    index = SiblingIndex(glyphs)
    rng = np.random.default_rng(0)
    for position in rng.choice(len(glyphs), size=60, replace=False):
        glyph = glyphs[position]
        for kind in ATTRIBUTE_KINDS:
            for sibling in index.siblings(glyph, kind):
                differs = {
                    "mark": sibling.letter.marks != glyph.letter.marks,
                    "case": sibling.letter.case != glyph.letter.case,
                    "weight": sibling.face.weight != glyph.face.weight,
                    "slant": sibling.face.slant != glyph.face.slant,
                    "typeface": sibling.face.typeface != glyph.face.typeface,
                }
                assert [name for name, changed in differs.items() if changed] == [kind]
                assert sibling.letter.base == glyph.letter.base


def test_glyphs_render_inside_the_frame_and_differ_by_face():
    letter = parse_letter(0x00C1)  # capital a with acute: the tallest kind of glyph
    images = [np.asarray(render_glyph(Glyph(letter, face), 32).convert("L")) for face in FACES]
    for image in images:
        assert image.min() < 128 and (image[0] > 200).all() and (image[-1] > 200).all()
    assert len({image.tobytes() for image in images}) == len(FACES)


def test_training_families_are_consecutive_siblings_of_a_base(glyph_data):
    manifest = json.loads((glyph_data / "manifest.json").read_text())
    train = samples(str(glyph_data / manifest["splits"]["train"]["data"]))
    assert len(train) == 256 and manifest["train_distinct_glyphs"] > 200
    for start in range(0, 256, 8):
        family = [sample["json"] for sample in train[start : start + 8]]
        assert len({meta["family"] for meta in family}) == 1
        assert family[0]["family_edit"] is None and all(meta["family_edit"] in ATTRIBUTE_KINDS for meta in family[1:])
        assert len({meta["caption"] for meta in family}) == 8
    first = train[1]
    assert first["txt"] == first["json"]["caption"]


def test_training_keys_carry_no_family_order_and_the_groups_name_the_one_edit_siblings(glyph_data):
    """The keys (the trainer's sample ids) are a permutation of the sample numbers, not in family order; two
    training glyphs share their k-th one-edit group exactly when they differ in attribute kind k alone (or are the
    same glyph), as the sibling index says, within and across families."""
    manifest = json.loads((glyph_data / "manifest.json").read_text())
    train = samples(str(glyph_data / manifest["splits"]["train"]["data"]))
    keys = [int(sample["json"]["key"]) for sample in train]
    assert sorted(keys) == list(range(256)) and keys != list(range(256))
    families = [sample["json"]["family"] for sample in train]
    assert np.mean([key // 8 == family for key, family in zip(keys, families)]) < 0.1  # no family in the ids
    glyph_of = {(glyph.caption): glyph for glyph in all_glyphs()}
    glyphs = [glyph_of[sample["json"]["caption"]] for sample in train]
    index = SiblingIndex(tuple(set(glyphs)))
    groups = [sample["json"]["clone_groups"] for sample in train]
    assert all(len(row) == len(ATTRIBUTE_KINDS) for row in groups)
    for i in range(0, 256, 5):
        for j in range(256):
            for k, kind in enumerate(ATTRIBUTE_KINDS):
                one_edit = glyphs[j] in index.siblings(glyphs[i], kind) or glyphs[j] == glyphs[i]
                assert (groups[i][k] == groups[j][k]) == one_edit, (i, j, kind)
    base_and_sibling = [(start, start + 1) for start in range(0, 256, 8)]
    assert all(any(a == b for a, b in zip(groups[i], groups[j])) for i, j in base_and_sibling)


def test_the_letters_set_classifies_each_test_glyph_by_its_letter(glyph_data):
    root = glyph_data / "benchmark" / "glyph_letters"
    classes = (root / "classnames.txt").read_text().splitlines()
    assert (root / "zeroshot_classification_templates.txt").read_text() == "a glyph of {c}.\n"
    test = [caption for _, caption, _ in read_clone_selection(glyph_data / "clone_selection")]
    shards = int((root / "test" / "nshards.txt").read_text())
    labelled = samples(str(root / "test" / f"{{0..{shards - 1}}}.tar"))
    assert len(labelled) == len(test) and len(classes) == len({caption.split(",")[0] for caption in test})
    assert all(test[position].startswith(classes[int(sample["cls"])] + ",") for position, sample in enumerate(labelled))


def test_val_and_test_glyphs_are_never_trained_on(glyph_data):
    manifest = json.loads((glyph_data / "manifest.json").read_text())
    trained = {sample["txt"] for sample in samples(str(glyph_data / manifest["splits"]["train"]["data"]))}
    val = {sample["txt"] for sample in samples(str(glyph_data / manifest["splits"]["val"]["data"]))}
    test = [caption for _, caption, _ in read_clone_selection(glyph_data / "clone_selection")]
    assert len(val) == manifest["glyphs"]["val"] and len(test) == manifest["glyphs"]["test"]
    assert not trained & val and not trained & set(test) and not val & set(test)
    assert {split_of(glyph, 0) for glyph in all_glyphs()[:300]} == {"train", "val", "test"}


def test_the_clone_selection_set_lists_each_test_glyphs_family(glyph_data):
    for _, caption, clones in list(read_clone_selection(glyph_data / "clone_selection"))[:50]:
        family = clones[FAMILY]
        assert 3 <= len(family) <= 7 and caption not in family and len(set(family)) == len(family)
        kinds = [kind for kind in clones if kind not in FAMILY_GROUPS]
        assert set(kinds) <= set(ATTRIBUTE_KINDS) and {"weight", "slant", "typeface"} <= set(kinds)
        assert all(clones[kind] in family for kind in kinds)


def test_weak_captions_keep_the_letter_and_drop_details():
    glyph = Glyph(parse_letter(0x1EBF), FACES[0])
    rng = np.random.default_rng(0)
    weak = {weak_caption(glyph, rng, 0.5) for _ in range(200)}
    assert all(text.startswith("latin small letter e") for text in weak)
    assert "latin small letter e" in weak and glyph.caption in weak and len(weak) == 16
    assert weak_caption(glyph, rng, 0.0) == glyph.caption


def test_the_manifest_counts_weak_caption_duplicates_and_records_the_licence(glyph_data):
    manifest = json.loads((glyph_data / "manifest.json").read_text())
    duplicates = manifest["train_caption_duplicates"]
    assert duplicates["txt"]["shared_in_split"] == 0
    assert 0.05 < duplicates["txt_weak"]["shared_in_split"] < 0.9  # 256 samples; 56% at the default 6144
    assert "Bitstream" in (glyph_data / "LICENSE_DEJAVU").read_text()
    assert "DejaVu" in (glyph_data / "ORIGIN.md").read_text()
    assert (glyph_data / "benchmark" / "glyph_retrieval" / "dataset_type.txt").read_text() == "retrieval\n"


def test_the_clone_selection_set_splits_each_family_into_mark_and_other_siblings(glyph_data):
    samples = list(read_clone_selection(glyph_data / "clone_selection"))[:50]
    for _, _, clones in samples:
        others, marks = clones.get(FAMILY_WITHOUT_MARK, []), clones.get(FAMILY_MARK, [])
        assert sorted(others + marks) == sorted(clones[FAMILY])
        assert ("mark" in clones) == bool(marks) and clones.get("mark") in [*marks, None]
    assert any(clones.get(FAMILY_MARK) for _, _, clones in samples)
    assert all(clones.get(FAMILY_WITHOUT_MARK) for _, _, clones in samples)


def test_family_accuracy_needs_the_true_caption_above_every_sibling():
    true = torch.tensor([0.5, 0.5, 0.5])
    clones = {"mark": torch.tensor([0.4, 0.6, float("nan")]), FAMILY: torch.tensor([0.45, 0.6, 0.7])}
    metrics = clone_selection_accuracy(true, clones)
    assert metrics["family_acc"] == pytest.approx(1 / 3)
    assert metrics["overall_acc"] == pytest.approx(1 / 2)  # the family is not pooled


def test_the_oracle_trains_on_the_glyph_families(glyph_data, tmp_path):
    """Through `training.main`, unchanged: the json family ids reach the oracle, whole families in a batch."""
    manifest = json.loads((glyph_data / "manifest.json").read_text())
    main(
        [
            "--train-data",
            str(glyph_data / manifest["splits"]["train"]["data"]),
            "--train-num-samples",
            "256",
            "--train-group-size",
            "8",
            "--batch-size",
            "32",
            "--model",
            "adacl-tiny",
            "--lr",
            "1e-3",
            "--warmup",
            "1",
            "--epochs",
            "1",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--loss",
            "oracle",
            "--caption-key",
            "txt_weak",
            "--logs",
            str(tmp_path),
            "--name",
            "oracle",
            "--log-every-n-steps",
            "1",
        ]
    )
    steps = RunDir(tmp_path / "oracle").metrics("train")
    assert len(steps) == 8 and all(record["stats/family_negatives"] == 7 for record in steps)


@pytest.mark.parametrize("accum_freq", [1, 2])
def test_adaclw_with_a_token_discovery_gets_the_captions_token_ids_from_the_trainer(glyph_data, tmp_path, accum_freq):
    """The trainer passes each batch's token ids to a loss that takes_text_tokens (with --accum-freq, every
    micro-batch's): the token discovery flags a minority of the negatives on every step."""
    manifest = json.loads((glyph_data / "manifest.json").read_text())
    main(
        [
            "--train-data",
            str(glyph_data / manifest["splits"]["train"]["data"]),
            "--train-num-samples",
            "256",
            "--train-group-size",
            "8",
            "--batch-size",
            str(32 // accum_freq),
            "--accum-freq",
            str(accum_freq),
            "--model",
            "adacl-tiny",
            "--lr",
            "1e-3",
            "--warmup",
            "1",
            "--epochs",
            "1",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--loss",
            "adaclw",
            "--adaclw-discovery",
            "text_image_tokens",
            "--logs",
            str(tmp_path),
            "--name",
            "adaclw",
            "--log-every-n-steps",
            "1",
        ]
    )
    steps = RunDir(tmp_path / "adaclw").metrics("train")
    assert len(steps) == 8  # 256 samples, 32 a step
    assert all(0 < record["stats/i2t/clone_share"] < 0.3 for record in steps)


def test_brace_pattern():
    assert brace_pattern("shard-{:06d}.tar", 3) == "shard-{000000..000002}.tar"
    assert brace_pattern("{}.tar", 1) == "0.tar"
