"""The benchmark runner: loss-variant specs, collapse verdicts, aggregation, the report, and one tiny run."""
import csv
import json
import math
from dataclasses import replace

import pytest

from training import params
from loss_comparison.cli import (QUICK, Budget, CollapseCriteria, LossVariant, ReportContext, RunJob, assess_run,
                                compare, data_from_manifest, launch_job, main, parse_loss_variant,
                                parse_loss_variants, parse_seeds, prepare_data, run_benchmark, summarize, train_argv,
                                worker_environment, write_report)

# The sizes of the `demo_shards` fixture (tests/conftest.py), so the runner reuses it as its data.
TINY = Budget(num_train=512, num_val=128, num_test=128, shard_size=128, batch_size=32, epochs=1, lr=2e-3, warmup=2,
              wd=0.1, workers=0, device="cpu", jobs=1, log_every_n_steps=1)


def fake_data(root, *, num_train, num_val):
    """BenchmarkData as `prepare_data` reads it from a manifest (train keys first, then val)."""
    return data_from_manifest(root, {"splits": {
        "train": {"data": "train/shard.tar", "num_samples": num_train, "keys": [0, num_train]},
        "val": {"data": "val/shard.tar", "num_samples": num_val, "keys": [num_train, num_train + num_val]},
    }})


# ---------------------------------------------------------------------------------------------
# Loss-variant specs


def test_specs_map_to_the_trainers_flags_and_parse_back():
    variants = parse_loss_variants("clip, adacl:literal, adacl:mode=calibrated,rho=0.05,modulate=false, glofnd")
    assert [v.label for v in variants] == [
        "clip", "adacl:mode=literal", "adacl:mode=calibrated,rho=0.05,modulate=false", "glofnd"]
    assert variants[1].flags(data_size=640) == ["--loss", "adacl", "--adacl-mode", "literal"]
    assert variants[2].flags(data_size=640) == ["--loss", "adacl", "--adacl-mode", "calibrated", "--adacl-rho", "0.05",
                                                "--no-adacl-modulate"]
    # glofnd declares data_size (its own --data-size flag): filled from the data's key range.
    assert variants[3].flags(data_size=640) == ["--loss", "glofnd", "--data-size", "640"]
    assert all(parse_loss_variant(v.label) == v for v in variants)
    assert variants[2].slug == "adacl-mode-calibrated-rho-0.05-modulate-false"


def test_generated_flags_are_accepted_by_the_trainer(tmp_path):
    data = fake_data(tmp_path, num_train=512, num_val=64)
    variant = parse_loss_variant("adacl:literal,eps=0.01,modulate=false")
    args = params.parse_args(train_argv(variant, 3, "run", QUICK, data, tmp_path))
    assert args.loss == "adacl" and args.seed == 3 and args.batch_size == QUICK.batch_size
    assert (args.loss_options["mode"], args.loss_options["eps"], args.loss_options["modulate"]) == ("literal", 0.01,
                                                                                                     False)
    glofnd = params.parse_args(train_argv(parse_loss_variant("glofnd"), 0, "run", QUICK, data, tmp_path))
    assert glofnd.loss_options["data_size"] == 512


@pytest.mark.parametrize("spec, message", [
    ("nosuch", "unknown loss 'nosuch'"),
    ("adacl:nosuch=1", "has no option 'nosuch'"),
    ("adacl:mode=sideways", "choose one of"),
    ("adacl:eps=small", "not a float"),
    ("adacl:sideways", "no option of 'adacl' has the choice 'sideways'"),
    ("clip:literal", "no option of 'clip'"),
    ("adacl:mode=literal,mode=calibrated", "sets mode more than once"),
    ("adacl:modulate=maybe", "not a boolean"),
])
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


# ---------------------------------------------------------------------------------------------
# Verdicts and aggregation on synthetic records


def record(label="clip", seed=0, *, status="ok", loss=1.2, i2t=0.3, t2i=0.3, softmax=True, batch=64, **metrics):
    values = {"train/final_loss": loss, "val/i2t_R@1": i2t, "val/t2i_R@1": t2i, "clone/color": 0.7,
              "clone/overall": 0.6, **metrics}
    return {"label": label, "loss": label.split(":")[0], "options": {}, "seed": seed, "name": f"{label}-seed{seed}",
            "status": status, "error": None if status == "ok" else "boom", "batch_size": batch,
            "softmax_loss": softmax, "train_seconds": 10.0, "eval_seconds": 2.0, "wall_seconds": 15.0,
            "val_num_samples": 512,
            "metrics": values}


def test_healthy_runs_are_ok():
    assert assess_run(record())["verdict"] == "ok"
    # A non-softmax loss (siglip) has no ln(batch) chance level: its loss value is not a collapse signal.
    assert assess_run(record("siglip", loss=10.0, softmax=False))["verdict"] == "ok"


def test_a_loss_pinned_at_log_batch_is_collapsed():
    verdict = assess_run(record(loss=math.log(64) * 0.97, i2t=0.2, t2i=0.2))
    assert verdict["verdict"] == "collapsed" and "ln(64)" in verdict["reasons"][0]
    assert assess_run(record(loss=math.log(64) * 0.9))["verdict"] == "ok"  # below 95% of chance: learning
    strict = CollapseCriteria(loss_fraction=0.85)
    assert assess_run(record(loss=math.log(64) * 0.9), strict)["verdict"] == "collapsed"


def test_recall_at_chance_is_collapsed_for_every_loss():
    chance = 1 / 512
    verdict = assess_run(record("siglip", loss=5.0, softmax=False, i2t=chance, t2i=2.5 * chance))
    assert verdict["verdict"] == "collapsed" and "chance" in verdict["reasons"][0]
    assert assess_run(record(i2t=2 * chance, t2i=2.5 * chance))["verdict"] == "ok"


def test_failed_nonfinite_and_incomplete_runs_are_flagged():
    assert assess_run(record(status="failed"))["verdict"] == "failed"
    assert assess_run(record(status="nonfinite"))["verdict"] == "nonfinite"
    nan_metric = assess_run(record(**{"clone/overall": math.nan}))
    assert nan_metric["verdict"] == "nonfinite" and "clone/overall" in nan_metric["reasons"][0]
    incomplete = record()
    del incomplete["metrics"]["val/i2t_R@1"]
    assert assess_run(incomplete)["verdict"] == "failed"


def assessed_records():
    """A: 2 ok runs and 1 collapsed run with wild numbers; B: 3 ok; C: all collapsed; D: one failed of two."""
    chance = 1 / 512
    return [assess_run(r) for r in [
        record("A", 0, i2t=0.30, **{"clone/overall": 0.60}),
        record("A", 1, i2t=0.34, **{"clone/overall": 0.64}),
        record("A", 2, loss=math.log(64), i2t=chance, t2i=chance, **{"clone/overall": 0.99}),
        record("B", 0, i2t=0.20, **{"clone/overall": 0.70}),
        record("B", 1, i2t=0.22, **{"clone/overall": 0.72}),
        record("B", 2, i2t=0.24, **{"clone/overall": 0.74}),
        record("C", 0, loss=math.log(64), i2t=chance, t2i=chance),
        record("C", 1, loss=math.log(64), i2t=chance, t2i=chance),
        record("D", 0, status="failed"),
        record("D", 1, i2t=0.1),
    ]]


def test_means_exclude_flagged_runs_and_rows_count_them():
    summaries = {s.label: s for s in summarize(assessed_records())}
    a = summaries["A"]
    assert a.runs_text() == "2/3 ok (1 collapsed)"
    assert a.metrics["clone/overall"].mean == pytest.approx(0.62) and a.metrics["clone/overall"].n == 2
    assert a.metrics["val/i2t_R@1"].std == pytest.approx(0.0282843, rel=1e-5)  # sample std of 0.30, 0.34
    assert summaries["B"].runs_text() == "3/3 ok"
    assert summaries["B"].metrics["clone/overall"].mean == pytest.approx(0.72)
    assert summaries["C"].runs_text() == "0/2 ok (2 collapsed)" and summaries["C"].metrics == {}
    assert summaries["D"].runs_text() == "1/2 ok (1 failed)" and math.isnan(summaries["D"].metrics["val/i2t_R@1"].std)
    assert list(summaries) == ["A", "B", "C", "D"]


def test_comparisons_say_whether_a_lead_exceeds_the_seed_spread():
    summaries = summarize(assessed_records())
    clone = compare(summaries, "clone/overall")
    assert clone.startswith("`B` is best on clone/overall (0.720 ± 0.020)") and "ahead of `D`" not in clone
    assert "ahead of `A` (0.620 ± 0.028) by 0.100, larger than" in clone
    close = summarize([assess_run(r) for r in [record("X", 0, i2t=0.30), record("X", 1, i2t=0.40),
                                                  record("Y", 0, i2t=0.33), record("Y", 1, i2t=0.35)]])
    assert "not a clear difference" in compare(close, "val/i2t_R@1")


def report_context(tmp_path):
    data = fake_data(tmp_path / "data", num_train=4096, num_val=512)
    machine = {"cpu": "Test CPU", "cores": "2", "python": "3.11", "torch": "2.x", "open_clip": "3.3.0",
               "clip_benchmark": "1.6.2", "load": "1.0", "code": "git abc"}
    return ReportContext(command="python -m training.benchmark --quick --seeds 0,1,2", budget=QUICK, data=data,
                         data_seed=0, seeds=[0, 1, 2], wall_seconds=600.0, machine=machine, started="today")


def test_report_markdown_csv_and_plot_from_synthetic_records(tmp_path):
    records = assessed_records()
    results_md = tmp_path / "docs" / "RESULTS.md"
    markdown = write_report(records, report_context(tmp_path), results_md, tmp_path / "out")
    assert results_md.read_text() == markdown
    assert "python -m training.benchmark --quick --seeds 0,1,2" in markdown and "Test CPU, 2 cores" in markdown
    assert "**10.0 min** for 10 runs; one run (its process: start, train, evaluate) took 15 s" in markdown
    assert "**192 steps** at batch 64" in markdown
    assert "| `A` | 2/3 ok (1 collapsed) | 0.320 ± 0.028 |" in markdown
    assert "| `C` | 0/2 ok (2 collapsed) | - |" in markdown
    assert "`A-seed2`: **collapsed**: final loss" in markdown and "`D-seed0`: **failed**: boom" in markdown
    assert "![main metrics" in markdown and "(RESULTS.png)" in markdown and "[RESULTS_runs.csv]" in markdown
    assert "`B` is best on clone/overall" in markdown and "Against `A`" in markdown  # no clip row: first is baseline

    png = results_md.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    with (tmp_path / "docs" / "RESULTS_runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records) and rows[2]["verdict"] == "collapsed" and rows[2]["clone/overall"] == "0.99"
    for name in ("results.md", "runs.csv", "results.png", "summary.csv"):
        assert (tmp_path / "out" / name).is_file()


def test_rewriting_the_report_keeps_the_hand_written_sections_below_the_marker(tmp_path):
    from loss_comparison.cli import KEEP_MARKER

    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("old generated table\n\n" + KEEP_MARKER + "\n## Throughput\nratio 1.14\n")
    markdown = write_report(assessed_records(), report_context(tmp_path), results_md, tmp_path / "out")
    text = results_md.read_text()
    assert "old generated table" not in text and text.startswith(markdown)
    assert text.endswith(KEEP_MARKER + "\n## Throughput\nratio 1.14\n")


def test_the_findings_name_hard_edit_types_ties_and_variants_that_change_nothing(tmp_path):
    clip = [record("clip", seed, **{"clone/color": 0.95, "clone/size": 0.85, "clone/shape": 0.52 + seed / 100})
            for seed in range(2)]
    # Another loss whose runs differ from clip's by at most 0.002 on any metric: it changed nothing.
    same = [{**r, "label": "same", "metrics": {k: v + 0.002 for k, v in r["metrics"].items()}} for r in clip]
    markdown = write_report([assess_run(r) for r in clip + same], report_context(tmp_path), tmp_path / "R.md",
                            tmp_path / "out")
    assert ("`clip` is below 0.9 on 2 of 3 clone edit types (shape, size), and within 0.05 of chance (0.5) on "
            "shape.") in markdown
    assert "`same` matches `clip` seed for seed (largest difference on any metric 0.0020)" in markdown
    assert "All 4 runs finished with finite losses and above-chance recall" in markdown
    tie = summarize([assess_run(record("X", 0)), assess_run(record("Y", 0))])
    assert compare(tie, "clone/overall") == "`X` and `Y` tie for best on clone/overall (0.600 (1 run))."


# ---------------------------------------------------------------------------------------------
# Data and processes


def test_data_is_reused_when_it_matches_and_never_overwritten(demo_shards, tmp_path):
    data = prepare_data(demo_shards, TINY, data_seed=0)
    assert data.num_train == 512 and data.data_size == 512 and data.train_data.endswith("shard-{000000..000003}.tar")
    with pytest.raises(ValueError, match="holds other demo data"):
        prepare_data(demo_shards, replace(TINY, num_train=1024), data_seed=0)
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "file.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no demo data manifest"):
        prepare_data(tmp_path / "stuff", TINY, data_seed=0)


def test_each_run_gets_its_share_of_threads_capped_by_the_callers(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_environment(4)["OMP_NUM_THREADS"] == "4" and worker_environment(32)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # this machine's rule: oversubscribed OpenMP is ~10x slower
    assert worker_environment(1)["OMP_NUM_THREADS"] == "1" and worker_environment(1)["MKL_NUM_THREADS"] == "1"


def test_a_run_whose_process_fails_gets_a_failed_record(tmp_path):
    job = RunJob(label="clip", loss="clip", options={}, seed=0, name="broken",
                 train_argv=["--train-data", str(tmp_path / "missing-{0..1}.tar"), "--model", "adacl-tiny",
                             "--device", "cpu", "--workers", "0", "--logs", str(tmp_path / "runs"), "--name", "broken"],
                 logs_dir=str(tmp_path / "runs"), data_root=str(tmp_path), batch_size=32, device="cpu",
                 record_path=str(tmp_path / "records" / "broken.json"))
    result = assess_run(launch_job(job, jobs=1, timeout=120))
    assert result["verdict"] == "failed" and "do not exist" in result["error"] and result["wall_seconds"] > 0
    assert "do not exist" in (tmp_path / "logs" / "broken.log").read_text()  # with the traceback
    assert json.loads((tmp_path / "records" / "broken.json").read_text())["status"] == "failed"


def test_one_tiny_benchmark_end_to_end_then_reused(demo_shards, tmp_path):
    """1 loss x 1 seed x 16 steps on the fixture's data: a record with every metric, and the report."""
    results_md = tmp_path / "RESULTS.md"
    records = run_benchmark([LossVariant("clip")], [0], TINY, output_dir=tmp_path / "bench", results_md=results_md,
                            data_dir=demo_shards, command="python -m training.benchmark (test)", echo=lambda _: None)
    (run,) = records
    assert run["status"] == "ok", run["error"]
    assert run["verdict"] in ("ok", "collapsed")  # 16 steps may or may not leave chance level; either is reported
    metrics = run["metrics"]
    assert metrics["train/steps"] == 16 and 0 < metrics["train/final_loss"] < 2 * math.log(32)
    expected = {"val/i2t_R@1", "val/t2i_R@5", "cls/scenes_shape/acc1", "cls/scenes_color/acc1",
                "ret/scenes_retrieval/image_R@1", "ret/scenes_retrieval/text_R@5", "clone/color", "clone/relation",
                "clone/shape", "clone/size", "clone/overall"}
    assert expected <= set(metrics) and all(0 <= metrics[key] <= 1 for key in expected)
    assert run["val_num_samples"] == 128
    assert (tmp_path / "bench" / "runs" / "clip-seed0" / "export" / "open_clip_config.json").is_file()
    assert (tmp_path / "bench" / "logs" / "clip-seed0.log").stat().st_size > 0
    markdown = results_md.read_text()
    assert "| `clip` | 1/1 ok |" in markdown or "| `clip` | 0/1 ok (1 collapsed) |" in markdown
    # --report-only writes the same report from the records, training nothing.
    main(["--report-only", "--output-dir", str(tmp_path / "bench"), "--results-md", str(tmp_path / "again.md")])
    assert (tmp_path / "again.md").read_text() == markdown.replace("RESULTS", "again")

    # The same call again reuses the finished run instead of training it again.
    again = run_benchmark([LossVariant("clip")], [0], TINY, output_dir=tmp_path / "bench", results_md=results_md,
                          data_dir=demo_shards, command="(test)", echo=lambda _: None)
    assert again[0]["reused"] and again[0]["metrics"] == metrics


def test_the_command_line_rejects_a_bad_budget_and_a_report_without_runs(tmp_path):
    with pytest.raises(ValueError, match="less than one batch"):
        main(["--num-train", "16", "--batch-size", "32", "--output-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown loss"):
        main(["--losses", "clip,nosuch", "--output-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="run the benchmark into --output-dir"):
        main(["--report-only", "--output-dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Paired differences and AdaCL's mechanism


def test_paired_differences_use_same_seed_pairs_and_a_t_interval(tmp_path):
    from loss_comparison.cli import paired_difference

    # Seeds move both losses together (0.1 apart per seed); the variant is 0.02 above clip on every seed.
    records = [assess_run(r) for seed in range(5) for r in (
        record("clip", seed, i2t=0.3 + 0.1 * seed), record("adacl", seed, i2t=0.32 + 0.1 * seed),
        record("noisy", seed, i2t=0.3 + 0.1 * seed + (0.05 if seed % 2 else -0.05)),
        record("collapsed", seed, loss=10.0, i2t=0.0, t2i=0.0),
        record("same", seed, i2t=0.3 + 0.1 * seed + 1e-7))]
    steady = paired_difference(records, "adacl", "clip", "val/i2t_R@1")
    assert steady.n == 5 and steady.mean == pytest.approx(0.02) and steady.half_width < 1e-9 and steady.clear
    noisy = paired_difference(records, "noisy", "clip", "val/i2t_R@1")
    # differences -0.05, +0.05, -0.05, +0.05, -0.05: mean -0.01, sd 0.0548, t(0.975, 4) = 2.776
    assert noisy.mean == pytest.approx(-0.01) and noisy.half_width == pytest.approx(2.776 * 0.05477 / 5 ** 0.5, rel=1e-3)
    assert not noisy.clear
    # A collapsed run drops its seed from the pairs.
    records[6] = assess_run(record("adacl", 1, loss=10.0, i2t=0.0, t2i=0.0))  # seed 1 of `adacl`
    assert paired_difference(records, "adacl", "clip", "val/i2t_R@1").n == 4
    markdown = write_report(records, report_context(tmp_path), tmp_path / "RESULTS.md", tmp_path / "out")
    assert "## Paired against `clip`" in markdown
    assert "| `adacl` | 4 |" in markdown and "+0.020 ± 0.000 *" in markdown
    assert "`adacl` vs `clip`: better on val/i2t_R@1 +0.020" in markdown
    assert "`noisy` vs `clip`: no paired difference excludes 0." in markdown
    # Float noise between runs that compute the same thing is a tie, however steady.
    assert "`same` vs `clip`: no paired difference excludes 0." in markdown
    assert "`collapsed` vs `clip`: no seed where both runs are ok (0/5 ok (5 collapsed))." in markdown


def test_mechanism_metrics_count_bound_activity_and_margin_spread():
    from loss_comparison.cli import mechanism_metrics

    steps = [{"stats/i2t/scale_bounded": 1.0, "stats/t2i/scale_bounded": 0.0, "stats/i2t/m1_over_scale": 1.2,
              "stats/t2i/m1_over_scale": 1.4, "stats/i2t/modulated": 1.0, "stats/t2i/modulated": 1.0},
             {"stats/i2t/scale_bounded": 0.0, "stats/t2i/scale_bounded": 0.0, "stats/i2t/m1_over_scale": 1.6,
              "stats/t2i/m1_over_scale": 1.8, "stats/i2t/modulated": 1.0, "stats/t2i/modulated": 0.0}]
    metrics = mechanism_metrics(steps)
    assert metrics["adacl/scale_bounded"] == 0.25 and metrics["adacl/modulated"] == 0.75
    assert metrics["adacl/m1_over_scale_mean"] == pytest.approx(1.5)
    assert metrics["adacl/m1_over_scale_std"] == pytest.approx(0.2236, rel=1e-3)
    assert mechanism_metrics([{"loss": 1.0}]) == {}


def test_fine_tuning_jobs_start_from_the_pretraining_runs_checkpoint(tmp_path):
    from loss_comparison.cli import plan_jobs, pretrain_job, pretrained_checkpoint

    data = fake_data(tmp_path, num_train=512, num_val=64)
    budget = replace(QUICK, epochs=2, lr=5e-4, pretrain_epochs=8, pretrain_lr=2e-3,
                     train_args=("--train-group-size", "8"))
    pretrain = pretrain_job(budget, data, tmp_path)
    args = params.parse_args(pretrain.train_argv)
    assert (pretrain.loss, args.epochs, args.lr, args.train_group_size) == ("clip", 8, 2e-3, 8)
    with pytest.raises(ValueError, match="left no checkpoint"):
        pretrained_checkpoint(pretrain)
    for epoch in (2, 8):
        (pretrain.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (pretrain.run_dir / "checkpoints" / f"epoch_{epoch}.pt").write_bytes(b"")
    checkpoint = pretrained_checkpoint(pretrain)
    assert checkpoint.endswith("epoch_8.pt")
    (job,) = plan_jobs([parse_loss_variant("adacl")], [0], budget, data, tmp_path, checkpoint)
    args = params.parse_args(job.train_argv)
    assert (args.pretrained, args.epochs, args.lr, args.train_group_size) == (checkpoint, 2, 5e-4, 8)
