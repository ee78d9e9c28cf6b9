"""Loss-variant specs: parsed and checked against each loss's options, mapped to the trainer's flag values."""

import pytest

from studies.comparison.variants import parse_loss_variant, parse_loss_variants, parse_seeds
from training.trainer.launch.params import args_from_values, argv_from_values


def test_specs_map_to_the_trainers_flags_and_parse_back():
    variants = parse_loss_variants("clip, adacl:literal, adacl:mode=calibrated,rho=0.05,modulate=false, glofnd")
    assert [v.label for v in variants] == [
        "clip",
        "adacl:mode=literal",
        "adacl:mode=calibrated,rho=0.05,modulate=false",
        "glofnd",
    ]
    assert variants[1].values(data_size=640) == {"loss": "adacl", "adacl_mode": "literal"}
    assert variants[2].values(data_size=640) == {
        "loss": "adacl",
        "adacl_mode": "calibrated",
        "adacl_rho": 0.05,
        "adacl_modulate": False,
    }
    assert argv_from_values(variants[2].values(data_size=640)) == [
        "--loss",
        "adacl",
        "--adacl-mode",
        "calibrated",
        "--adacl-rho",
        "0.05",
        "--no-adacl-modulate",
    ]
    # glofnd needs sample indices (its Options carry --data-size): filled from the data's key range.
    assert variants[3].values(data_size=640) == {"loss": "glofnd", "data_size": 640}
    assert all(parse_loss_variant(v.label) == v for v in variants)
    assert variants[2].slug == "adacl-mode-calibrated-rho-0.05-modulate-false"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nosuch", "unknown loss 'nosuch'"),
        ("adacl:nosuch=1", "has no option 'nosuch'"),
        ("adacl:mode=sideways", r"adacl:mode=sideways: option mode must be one of \['literal', 'calibrated'\]"),
        ("adacl:eps=2", r"eps must be in \(0, 1\), got 2.0"),  # the loss's own check, not a second copy of it
        ("glofnd:alpha=1", r"alpha must be in \[0, 1\)"),
        ("adacl:eps=small", "not a float"),
        ("adacl:sideways", "no option of 'adacl' has the choice 'sideways'"),
        ("clip:literal", "no option of 'clip'"),
        ("adacl:mode=literal,mode=calibrated", "sets mode more than once"),
        ("adacl:modulate=maybe", "not a boolean"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_loss_variant(spec)


def test_variant_lists_refuse_duplicates_and_stray_options():
    with pytest.raises(ValueError, match="listed twice"):
        parse_loss_variants("adacl:literal,adacl:mode=literal")
    with pytest.raises(ValueError, match="before any loss name"):
        parse_loss_variants("eps=0.1,clip")
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    with pytest.raises(ValueError, match="distinct"):
        parse_seeds("1,1")


def test_the_positive_controls_parse_into_their_options():
    oracle, hnnce = parse_loss_variants("oracle:weight=16, hnnce:beta=0.5,alpha=1")
    assert oracle.values(data_size=640) == {"loss": "oracle", "oracle_weight": 16.0}
    assert hnnce.values(data_size=640) == {"loss": "hnnce", "hnnce_beta": 0.5, "hnnce_alpha": 1.0}
    shards = {"train_data": "shards/{0..1}.tar", "model": "adacl-tiny"}
    assert args_from_values({**shards, **oracle.values(data_size=640)}).loss_options == {
        "weight": 16.0,
        "family_field": "family",
    }
    assert args_from_values({**shards, **hnnce.values(data_size=640)}).loss_options == {"beta": 0.5, "alpha": 1.0}
    with pytest.raises(ValueError, match="weight must be >= 0"):
        parse_loss_variant("oracle:weight=-4")
