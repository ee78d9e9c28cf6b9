"""`--adacl-preset first-reading` (and `paper`): Algorithm 1 as docs/method.md §3 reads it, checked step by
step against a plain re-computation from `open_clip_adacl.adacl_math` and the method's dense definitions
(helpers/adacl_reference.py), and the
presets' contract (what they set, what they refuse, what params.txt records)."""

import pytest
import torch
import torch.nn.functional as F

from helpers.selection_cases import algorithm_1_anchor_row
from open_clip_adacl import adacl_math, create_loss
from open_clip_adacl.losses.adacl import AdaCLLoss
from training import ConfigError
from training.trainer.launch.params import parse_args

SCALE = 14.3
EPS = 1e-3
STD_FLOOR = 1e-4


def _features(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    y = F.normalize(x + 0.8 * torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    return x.float(), y.float()


def _algorithm_1_direction(queries, candidates, scale, previous):
    """One direction of Algorithm 1 from the reference functions: (positive-logit CE, m1, m2)."""
    logits = scale * queries @ candidates.T
    n = logits.shape[0]
    labels = torch.arange(n)
    row = algorithm_1_anchor_row(logits, STD_FLOOR * scale.detach())
    with torch.no_grad():
        detached = logits.detach()
        negatives = adacl_math.negative_mask(n, n, labels)
        anchor = (queries[row] * candidates[row]).sum().detach()
        log_z_u = torch.logsumexp(detached[row][negatives[row]].double(), 0)
        p_u_log_odds = adacl_math.anchor_log_odds(anchor, log_z_u, scale.detach(), *previous)
        eps_log_odds = torch.logit(torch.tensor(EPS, dtype=torch.float64))
        m1, m2 = adacl_math.margins_from_log_odds(anchor, p_u_log_odds, log_z_u, eps_log_odds, 1.0)
        assert adacl_math.margins_valid(m1, m2, anchor, p_u_log_odds, eps_log_odds, 1.0)
    similarity = (queries * candidates).sum(-1)
    positive = m1.float() * (similarity - m2.float())  # the steep positive: slope m1, no gradient to t
    modulated = torch.where(torch.eye(n, dtype=torch.bool), positive[:, None].expand_as(logits), logits)
    return F.cross_entropy(modulated, labels), m1, m2


def test_two_training_steps_equal_algorithm_1_recomputed_from_the_reference_functions():
    loss_fn = create_loss("adacl", preset="first-reading", eps=EPS)
    previous = {"i2t": (None, None), "t2i": (None, None)}  # before any step p_u is vanilla
    for step, seed in enumerate((11, 12)):
        x, y = _features(24, 16, seed)
        x_ours, y_ours = x.clone().requires_grad_(), y.clone().requires_grad_()
        scale_ours = torch.tensor(SCALE, requires_grad=True)
        value = loss_fn(x_ours, y_ours, scale_ours)
        value.backward()
        stats = {name: float(v) for name, v in loss_fn.stats.items()}
        loss_fn.commit()

        x_ref, y_ref = x.clone().requires_grad_(), y.clone().requires_grad_()
        scale_ref = torch.tensor(SCALE, requires_grad=True)
        losses = []
        for direction, (queries, candidates) in (("i2t", (x_ref, y_ref)), ("t2i", (y_ref, x_ref))):
            loss, m1, m2 = _algorithm_1_direction(queries, candidates, scale_ref, previous[direction])
            assert stats[f"{direction}/modulated"] == 1, f"step {step} {direction} fell back"
            assert stats[f"{direction}/m1"] == pytest.approx(float(m1), rel=1e-6)
            # log Z_u is summed in float32 by the loss: m2 (a difference of near-equal terms) agrees to ~1e-8 absolute
            assert stats[f"{direction}/m2"] == pytest.approx(float(m2), abs=1e-7)
            previous[direction] = (m1, m2)  # the progressive p_u of the next step
            losses.append(loss)
        reference = (losses[0] + losses[1]) / 2
        reference.backward()
        torch.testing.assert_close(value.detach(), reference.detach(), rtol=1e-5, atol=1e-6)
        for ours, ref in ((x_ours.grad, x_ref.grad), (y_ours.grad, y_ref.grad), (scale_ours.grad, scale_ref.grad)):
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-6)


def test_the_preset_sets_every_choice_of_algorithm_1():
    options = create_loss("adacl", preset="first-reading").options
    assert (
        options.mode,
        options.candidate_region,
        options.anchor_stat,
        options.anchor_prob,
        options.positive_grad,
        options.boundary,
        options.boundary_kind,
        options.salient,
        options.modulate,
    ) == ("literal", "gda", "median", "progressive", "fixed", 1.0, "fixed", "max", True)
    assert create_loss("adacl", preset="first-reading", eps=1e-4).options.eps == 1e-4  # eps was not recovered: free


def test_a_value_contradicting_the_preset_is_refused_and_an_agreeing_one_accepted():
    with pytest.raises(ValueError, match="preset 'first-reading' sets mode='literal'; drop mode='calibrated'"):
        create_loss("adacl", preset="first-reading", mode="calibrated")
    assert create_loss("adacl", preset="first-reading", mode="literal").options.mode == "literal"
    with pytest.raises(ValueError, match="preset 'first-reading' sets"):
        AdaCLLoss.Options(preset="first-reading")  # half applied: the defaults disagree with it


def test_the_trainer_records_every_resolved_option_and_refuses_conflicts():
    args = parse_args(["--train-data", "x.tar", "--loss", "adacl", "--adacl-preset", "first-reading"])
    assert (
        args.adacl_preset,
        args.adacl_mode,
        args.adacl_candidate_region,
        args.adacl_anchor_prob,
        args.adacl_positive_grad,
    ) == ("first-reading", "literal", "gda", "progressive", "fixed")
    assert args.loss_options["candidate_region"] == "gda"
    with pytest.raises(ConfigError, match="drop --adacl-candidate-region='upper' or the --adacl-preset"):
        parse_args(
            [
                "--train-data",
                "x.tar",
                "--loss",
                "adacl",
                "--adacl-preset",
                "first-reading",
                "--adacl-candidate-region",
                "upper",
            ]
        )


def test_the_loss_comparison_accepts_the_preset_as_a_variant():
    from studies.comparison.variants import parse_loss_variants

    (variant,) = parse_loss_variants("adacl:paper")
    assert variant.values(data_size=8) == {"loss": "adacl", "adacl_preset": "paper"}


def test_paper_is_the_reading_that_trained_and_first_reading_our_first():
    paper = create_loss("adacl", preset="paper").options
    assert (
        paper.anchor_value,
        paper.anchor_prob,
        paper.margin_grad,
        paper.eps,
        paper.mode,
        paper.candidate_region,
    ) == ("positive", "vanilla", "closed_form", 1e-4, "literal", "gda")
    first = create_loss("adacl", preset="first-reading").options
    assert (first.anchor_value, first.anchor_prob, first.margin_grad) == ("positive", "progressive", "detached")
    differ = ("preset", "anchor_prob", "margin_grad", "eps")
    assert {k: v for k, v in vars(paper).items() if k not in differ} == {
        k: v for k, v in vars(first).items() if k not in differ
    }
    with pytest.raises(ValueError, match="preset 'paper' sets eps=0.0001"):
        create_loss("adacl", preset="paper", eps=1e-3)  # the reading that trained is the one at eps 1e-4
