"""The icon data set: Material Design Icons from the qtawesome wheel, families of a base icon and its named variants
defined from the charmap's names, held-out icons never trained on, and shards the trainer reads unchanged.

The data is written for a subset of the families (the rule itself runs on the whole charmap), to keep the tests
fast."""

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
import webdataset as wds

from studies.icons import build_catalogue, mdi_catalogue, write_icon_dataset
from studies.icons.catalogue import charmap, root_of, variant_words
from studies.icons.rendering import render_icon
from studies.icons.writers import FINE_SHARE, MARK_KIND, group_id, ink, split_of
from training import RunDir
from training.evaluation.clone_selection import FAMILY, FAMILY_WITHOUT_MARK, read_clone_selection
from training.main import main

FAMILIES = ("account", "folder", "battery", "arrow-up", "cloud", "bell")  # roots of the written subset


def subset(roots):
    """The catalogue restricted to the families of `roots` (their icons and roots as the whole charmap's rule
    gives them)."""
    full = mdi_catalogue()
    icons = tuple(icon for icon in full.icons if full.root[icon.name] in roots)
    return replace(full, icons=icons, root={icon.name: full.root[icon.name] for icon in icons})


def write(root, seed=0):
    return write_icon_dataset(root, seed=seed, num_train=256, shard_size=128, catalogue=subset(FAMILIES))


@pytest.fixture(scope="module")
def icon_data(module_tmp):
    root = module_tmp("icons") / "data"
    write(root)
    return root


def samples(pattern: str):
    import braceexpand

    return list(wds.WebDataset(list(braceexpand.braceexpand(pattern)), shardshuffle=False).decode("pil"))


def test_the_charmap_is_the_wheels_and_every_code_point_is_in_the_font():
    from fontTools.ttLib import TTFont

    from studies.icons.catalogue import FONT_FILE, distribution_file

    names = charmap()
    font = set(TTFont(distribution_file(FONT_FILE), lazy=True).getBestCmap())
    assert len(names) > 7000 and set(names.values()) <= font and len(set(names.values())) == len(names)


def test_families_follow_the_declared_rule_on_known_names():
    """account and its variants share a family; a word is a variant word exactly when it follows at least
    MIN_BASES names that are icons; a root is the shortest icon the name extends by variant words only."""
    names = frozenset(charmap())
    catalogue = mdi_catalogue()
    words = catalogue.words
    assert {"outline", "off", "plus", "minus", "check", "alert", "up", "down", "left", "right"} <= words
    for name in ("account-outline", "account-plus", "account-plus-outline", "account-off"):
        assert name in names and catalogue.root[name] == "account"
    assert catalogue.variant_of(next(i for i in catalogue.icons if i.name == "account-plus-outline")) == "plus outline"
    for word in ("outline", "up", "music"):
        count = sum(name.rpartition("-")[0] in names for name in names if name.rpartition("-")[2] == word)
        assert (word in words) == (count >= 10)
    assert root_of("file-music", names, words) == "file-music"  # music follows too few icons to be a variant word
    for members in catalogue.families().values():
        root = members[0].name
        assert len(members) >= 3 and all(catalogue.root[icon.name] == root for icon in members)
        assert all(icon.name.startswith(root + "-") for icon in members[1:])


def test_the_rule_on_a_made_up_charmap():
    names = {"a": 1, "a-x": 2, "a-x-y": 3, "b": 4, "b-x": 5, "b-y": 6, "c": 7, "c-x": 8, "d-y": 9, "d": 10}
    catalogue = build_catalogue(names, min_bases=2)
    assert catalogue.words == frozenset({"x", "y"}) and variant_words(frozenset(names), 4) == frozenset()
    assert {root: [icon.name for icon in members] for root, members in catalogue.families().items()} == {
        "a": ["a", "a-x", "a-x-y"],
        "b": ["b", "b-x", "b-y"],
    }


def test_every_icon_renders_non_blank_and_deterministically():
    catalogue = mdi_catalogue()
    for icon in catalogue.icons:
        pixels = ink(render_icon(icon, 32))
        assert 0 < pixels.sum() < pixels.size
    icon = catalogue.icons[0]
    assert render_icon(icon, 32).tobytes() == render_icon(icon, 32).tobytes()


def test_the_writer_is_deterministic(icon_data, module_tmp):
    again = module_tmp("icons_again") / "data"
    write(again)

    def digests(root):
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
        }

    assert digests(icon_data) == digests(again)


def test_training_families_are_consecutive_icons_of_one_family_and_non_blank(icon_data):
    manifest = json.loads((icon_data / "manifest.json").read_text())
    train = samples(str(icon_data / manifest["splits"]["train"]["data"]))
    assert len(train) == 256 and manifest["family_size"] == 4
    for start in range(0, 256, 4):
        family = [sample["json"] for sample in train[start : start + 4]]
        assert len({meta["family"] for meta in family}) == 1 and len({meta["family_root"] for meta in family}) == 1
        assert len({meta["caption"] for meta in family}) == 4
        assert all(meta["clone_groups"] == [group_id(meta["family_root"])] for meta in family)
    for sample in train:
        assert sample["txt"] == sample["json"]["caption"] == sample["json"]["name"].replace("-", " ")
        assert 0 < ink(sample["png"]).sum() < 32 * 32


def test_training_keys_carry_no_family_order(icon_data):
    manifest = json.loads((icon_data / "manifest.json").read_text())
    train = samples(str(icon_data / manifest["splits"]["train"]["data"]))
    keys = [int(sample["json"]["key"]) for sample in train]
    assert sorted(keys) == list(range(256)) and keys != list(range(256))
    families = [sample["json"]["family"] for sample in train]
    assert np.mean([key // 4 == family for key, family in zip(keys, families)]) < 0.1


def test_val_and_test_icons_are_never_trained_on(icon_data):
    manifest = json.loads((icon_data / "manifest.json").read_text())
    trained = {sample["txt"] for sample in samples(str(icon_data / manifest["splits"]["train"]["data"]))}
    val = {sample["txt"] for sample in samples(str(icon_data / manifest["splits"]["val"]["data"]))}
    test = [caption for _, caption, _ in read_clone_selection(icon_data / "clone_selection")]
    assert len(val) == manifest["icons"]["val"] and len(test) == manifest["icons"]["test"]
    assert not trained & val and not trained & set(test) and not val & set(test)
    assert {split_of(icon, 0) for icon in mdi_catalogue().icons[:200]} == {"train", "val", "test"}


def test_the_clone_selection_lists_each_test_icons_siblings_and_their_kinds(icon_data):
    catalogue = mdi_catalogue()
    by_caption = {icon.caption: icon for icon in catalogue.icons}
    for image, caption, clones in read_clone_selection(icon_data / "clone_selection"):
        family = clones[FAMILY]
        root = catalogue.root[by_caption[caption].name]
        assert 2 <= len(family) <= 3 and caption not in family and len(set(family)) == len(family)
        assert all(catalogue.root[by_caption[sibling].name] == root for sibling in family)
        icon_ink = ink(image)
        for sibling in family:
            fine = (icon_ink != ink(render_icon(by_caption[sibling], 32))).mean() <= FINE_SHARE
            assert fine == (sibling in clones.get("family_mark", [])) and fine != (
                sibling in clones[FAMILY_WITHOUT_MARK]
            )
        assert set(clones) - {FAMILY, FAMILY_WITHOUT_MARK, "family_mark"} <= {MARK_KIND, "variant"}


def test_the_families_set_and_the_licences(icon_data):
    root = icon_data / "benchmark" / "icon_families"
    classes = (root / "classnames.txt").read_text().splitlines()
    assert set(classes) <= {name.replace("-", " ") for name in FAMILIES}
    labelled = samples(str(root / "test" / "0.tar"))
    test = [caption for _, caption, _ in read_clone_selection(icon_data / "clone_selection")]
    assert len(labelled) == len(test)
    assert all(test[position].startswith(classes[int(sample["cls"])]) for position, sample in enumerate(labelled))
    assert "Apache License" in (icon_data / "LICENSE_MDI").read_text()
    assert "MIT" in (icon_data / "LICENSE_QTAWESOME").read_text()
    assert "Material Design Icons" in (icon_data / "ORIGIN.md").read_text()
    manifest = json.loads((icon_data / "manifest.json").read_text())
    assert manifest["source"]["distribution"] == "QtAwesome==1.4.2"


def test_the_oracle_trains_on_the_icon_families_through_the_trainer(icon_data, tmp_path):
    """Through `training.main`, unchanged: the json group ids reach the oracle, whole families in a batch."""
    manifest = json.loads((icon_data / "manifest.json").read_text())
    flags = {
        "--train-data": str(icon_data / manifest["splits"]["train"]["data"]),
        "--train-num-samples": "256",
        "--train-group-size": "4",
        "--batch-size": "32",
        "--model": "adacl-tiny",
        "--lr": "1e-3",
        "--warmup": "1",
        "--epochs": "1",
        "--workers": "0",
        "--device": "cpu",
        "--loss": "oracle",
        "--oracle-family-field": "clone_groups",
        "--logs": str(tmp_path),
        "--name": "oracle",
        "--log-every-n-steps": "1",
    }
    main([part for flag, value in flags.items() for part in (flag, value)])
    steps = RunDir(tmp_path / "oracle").metrics("train")
    assert len(steps) == 8 and all(record["stats/family_negatives"] >= 3 for record in steps)


def test_the_lab_reads_the_written_icons_as_a_comparisons_own_data(icon_data, tmp_path):
    """`studies.data.IconData`: a written folder (here the subset's) is read as a comparison's own data with its
    clip-benchmark sets and clone selection."""
    from studies.data import IconData

    folder = IconData(seed=0).folder(tmp_path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(icon_data)
    own = IconData(seed=0).comparison_data(tmp_path).own_data
    assert own.data.num_train == 256 and own.benchmarks.datasets == ("wds/icon_families", "wds/icon_retrieval")
    assert own.benchmarks.clone_selection_dir == str(folder / "clone_selection")
