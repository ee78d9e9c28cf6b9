"""The throughput scripts stay runnable: gpu_bench.sh parses and its Python steps run on the CPU at toy sizes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.bench_scripts import bench_script

REPO = Path(__file__).resolve().parents[1]
GPU_BENCH = REPO / "scripts" / "gpu_bench.sh"


def test_gpu_bench_parses():
    result = subprocess.run(["bash", "-n", str(GPU_BENCH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_gpu_bench_smoke_runs_every_step_on_cpu(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(GPU_BENCH), "--smoke", str(tmp_path)], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "step.json").read_text())["rows"]
    assert [(row["model"], row["loss"]) for row in rows] == [("adacl-tiny", "clip"), ("adacl-tiny", "adacl")]
    assert rows[0]["ratio"] == 1.0 and all(row["samples_per_second"] > 0 for row in rows)
    summary = (tmp_path / "summary.md").read_text()
    assert "scripts/bench_step.py --smoke --device cpu" in summary and "| adacl-tiny | 8 | adacl |" in summary
    # the one table: both parts, every input kind, both modes on each path
    assert "| training step, adacl-tiny | - | 8 | adacl | auto |" in summary
    for inputs in ("random", "trained-50", "trained-100"):
        for mode in ("literal", "calibrated"):
            for path in ("auto", "fused", "eager"):
                assert f"| loss | {inputs} | 128 | adacl-{mode} | {path} |" in summary
    assert "auto's choices" in summary and "median anchor passes, 128 x 128 float32 on cpu: eager" in summary
    # the third part: each case's peak memory and its ratio to ClipLoss's
    assert "## Loss only, peak memory" in summary and "| extra peak |" in summary
    for loss in ("clip | -", "adacl-literal | auto", "adacl-calibrated | auto"):
        assert re.search(rf"\| trained-50 \| 128 \| 1 \| {loss} \| \d+\.\d \|", summary), loss
    # the fourth part: every registered loss beside ClipLoss (on the CPU the GPU's path forced, no peak memory)
    assert "## Every registered loss, time, peak memory and host waits" in summary
    for loss in ("ClipLoss", "adacl (calibrated)", "adaclw/text_image_tokens", "siglip"):
        assert f"| {loss} | 64 | " in summary, loss


def test_gpu_bench_refuses_unexpected_arguments_in_one_line():
    result = subprocess.run(["bash", str(GPU_BENCH), "--fast"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: unexpected arguments '--fast'; usage: bash scripts/gpu_bench.sh [--smoke] [OUTPUT_DIR]"
    ]


@pytest.mark.slow
def test_combining_files_that_are_not_benchmark_output_is_one_line(tmp_path):
    (tmp_path / "step.json").write_text("{}")
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_loss.py"),
            "--combine",
            str(tmp_path / "step.json"),
            str(tmp_path / "missing.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: cannot combine") and "pass a bench_step.py --output" in result.stderr


def test_bench_step_reports_the_ratio_and_the_loss_share_of_the_step(tmp_path, capsys):
    rows = bench_script("bench_step").main(["--smoke", "--threads", "1", "--output", str(tmp_path / "step.json")])
    assert [row["loss"] for row in rows] == ["clip", "adacl"] and rows[0]["ratio"] == 1.0
    assert all(
        0 < row["loss_seconds"] < row["seconds"] and row["loss_share"] == row["loss_seconds"] / row["seconds"]
        for row in rows
    )
    printed = capsys.readouterr().out
    assert "loss's share of the step |" in printed and "; code " in printed and "(family " in printed
    # every loss steps the one model and AdamW, so where a copy lies in memory cannot count as the loss's cost
    import torch

    trainees = bench_script("bench_step").build_trainees("adacl-tiny", ["clip", "adacl"], "fp32", torch.device("cpu"))
    clip, adacl = trainees["clip"], trainees["adacl"]
    assert clip.model is adacl.model and clip.optimizer is adacl.optimizer and clip.loss is not adacl.loss


@pytest.mark.slow
def test_bench_loss_measures_each_cases_peak_memory_in_one_process_and_per_rank(tmp_path):
    output = tmp_path / "loss.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_loss.py"),
            "--sizes",
            "256",
            "--dim",
            "16",
            "--inputs",
            "trained-50",
            "--paths",
            "eager",
            "--memory-only",
            "--ranks",
            "2",
            "--threads",
            "1",
            "--json",
            str(output),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| peak memory (MiB) | each rank (MiB) | memory ratio | extra peak |" in result.stdout
    rows = json.loads(output.read_text())["memory_rows"]
    assert [(row["ranks"], row["loss"]) for row in rows] == [
        (ranks, loss) for ranks in (1, 2) for loss in ("clip", "adacl-literal", "adacl-calibrated")
    ]
    for row in rows:  # a number per case, and on 2 ranks each rank's own
        assert row["peak_bytes"] >= 0 and len(row["rank_peak_bytes"]) == row["ranks"]
        assert row["peak_bytes"] == max(row["rank_peak_bytes"])
        printed = (
            f"| trained-50 | 256 | {row['ranks']} | {row['loss']} | {row['path']} | {row['peak_bytes'] / 2**20:.1f} |"
        )
        assert printed in result.stdout


@pytest.mark.slow
def test_bench_loss_refuses_ranks_it_cannot_measure_in_one_line():
    for extra in (["--ranks", "2"], ["--memory", "--ranks", "3"], ["--memory", "--ranks", "2", "--device", "cuda"]):
        result = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "bench_loss.py"), "--sizes", "64", *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("bench_loss.py: error: "), (
            extra,
            result.stderr,
        )


def test_bench_loss_in_processes_reports_the_median_and_range_of_each_path(monkeypatch, tmp_path):
    bench = bench_script("bench_loss")
    ratios = iter([1.2, 1.0, 1.4, 1.1, 1.3, 1.2])  # processes in the order auto, eager; eager, auto; auto, eager

    def fake_run(command, **kwargs):
        path, output = command[command.index("--paths") + 1], Path(command[command.index("--json") + 1])
        ratio = next(ratios)
        rows = [
            {
                "inputs": "trained-50",
                "N": 64,
                "loss": "clip",
                "path": "-",
                "seconds": 1.0,
                "time_ratio": 1.0,
                "cpu_seconds": 2.0,
                "cpu_ratio": 1.0,
            }
        ]
        rows += [
            {
                "inputs": "trained-50",
                "N": 64,
                "loss": f"adacl-{mode}",
                "path": path,
                "seconds": ratio,
                "time_ratio": ratio,
                "cpu_seconds": 2 * ratio,
                "cpu_ratio": ratio,
            }
            for mode in bench.MODES
        ]
        decisions = (
            [
                {
                    "passes": "keys",
                    "rows": 64,
                    "cols": 64,
                    "dtype": "float32",
                    "device": "cpu",
                    "choice": "eager",
                    "fused_ms": None,
                    "eager_ms": 1.0,
                }
            ]
            if path == "auto"
            else []
        )
        output.write_text(json.dumps({"rows": rows, "auto_choices": decisions}))

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    args = bench.parse_args(["--sizes", "64", "--inputs", "trained-50", "--paths", "auto", "eager", "--processes", "3"])
    args.scratch = str(tmp_path)
    rows, decisions = bench.benchmark_in_processes(args)
    assert [(row["loss"], row["path"]) for row in rows] == [
        ("clip", "-"),
        ("adacl-literal", "auto"),
        ("adacl-literal", "eager"),
        ("adacl-calibrated", "auto"),
        ("adacl-calibrated", "eager"),
    ]
    auto, eager = rows[1], rows[2]  # auto ran 1.2, 1.1, 1.3; eager 1.0, 1.4, 1.2
    assert auto["time_ratio"] == 1.2 and auto["time_ratio_range"] == (1.1, 1.3) and auto["processes"] == 3
    assert eager["time_ratio"] == 1.2 and eager["time_ratio_range"] == (1.0, 1.4)
    assert "auto_over_best" not in auto  # no fused path measured
    # each process's ratio to its own ClipLoss, paired: the geometric mean over the processes
    assert auto["paired_ratio"][0] == pytest.approx((1.2 * 1.1 * 1.3) ** (1 / 3))
    assert auto["paired_ratio"][1] < 1.1 and auto["paired_ratio"][2] > 1.3 and rows[0].get("paired_ratio") is None
    assert len(decisions) == 3
    assert bench.auto_choices(decisions[:1] + [{**decisions[0], "choice": "fused", "fused_ms": 17.419}]) == (
        "- keys passes, 64 x 64 float32 on cpu: eager (fused - ms, eager 1.0 ms)\n"
        "- keys passes, 64 x 64 float32 on cpu: fused (fused 17.4 ms, eager 1.0 ms)"
    )
    table = bench.markdown_table(rows)
    assert "| ratio range |" in table and "| 1.200 | 1.100-1.300 |" in table


def test_bench_threads_times_the_loss_with_its_threads_and_without(tmp_path, monkeypatch, capsys):
    import torch

    from open_clip_adacl import row_passes

    bench = bench_script("bench_threads")
    calls = []
    side_by_side = row_passes.side_by_side
    monkeypatch.setattr(
        row_passes,
        "side_by_side",
        lambda device, run: (
            calls.append((len(run), row_passes.can_run_side_by_side(device, len(run)))) or side_by_side(device, run)
        ),
    )
    threads = torch.get_num_threads()
    try:
        with bench.without_own_threads():
            assert not row_passes.can_run_side_by_side(torch.device("cpu"), 2)
        assert row_passes.can_run_side_by_side(torch.device("cpu"), 2) or threads < 2
        steps = bench.loss_steps(64, 16, "trained-50", "literal")
        torch.set_num_threads(2)
        steps["in turn"]()
        assert calls == [(2, False)] * 2  # each direction's summary, its row shares in turn
        calls.clear()
        steps["side by side"]()
        assert calls == [(2, True)]  # the directions, each on one thread, its summary's rows with it
        bench.main(
            [
                "--size",
                "64",
                "--dim",
                "16",
                "--repeats",
                "2",
                "--modes",
                "calibrated",
                "--busy",
                "1",
                "--output",
                str(tmp_path / "threads.md"),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    report = (tmp_path / "threads.md").read_text()
    assert report == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "1 busy process(es) beside it" in report and "(family " in report and "; code " in report
    for row in (
        "| clip | - |",
        "| adacl-calibrated | side by side |",
        "| adacl-calibrated | in turn |",
        "| rows split |",
        "| in turn |",
        "| one thread |",
    ):
        assert row in report, row
    assert re.search(
        r"\| adacl-calibrated \| in turn \| [\d.]+ \| [\d.]+ \[[\d.]+, [\d.]+\] \| 1\.000 \[1\.000, "
        r"1\.000\] \|",
        report,
    )


def test_bench_loss_times_adaclw_with_each_discovery_beside_clip_alone(monkeypatch, capsys, tmp_path):
    import torch

    monkeypatch.setenv("OPEN_CLIP_ADACL_FUSED", "auto")  # the benchmark sets it per case
    bench = bench_script("bench_loss")
    discoveries = ["gda", "features", "tokens", "text_image_tokens", "persistence_text_image_tokens"]
    argv = ["--sizes", "48", "--dim", "16", "--inputs", "trained-50", "--repeats", "3", "--paths"]
    argv += ["--threads", str(torch.get_num_threads()), "--json", str(tmp_path / "loss.json"), "--discoveries"]
    bench.main(argv + discoveries)
    printed = capsys.readouterr().out
    rows = json.loads((tmp_path / "loss.json").read_text())["rows"]
    assert [row["loss"] for row in rows] == ["clip"] + [f"adaclw/{name}" for name in discoveries]
    for row in rows[1:]:  # each discovery's ratios, paired by round, wall clock and CPU time
        assert len(row["paired_ratio"]) == 3 and len(row["paired_cpu_ratio"]) == 3
        assert re.search(
            rf"\| trained-50 \| 48 \| {row['loss']} \| - \| [\d.]+ \| [\d.]+ \| [\d.]+ \[[\d.]+, [\d.]+\] \|", printed
        ), row["loss"]
    # Without --discoveries the cases are the ones they were; --paths without a value needs a discovery.
    assert bench.cases(["auto"]) == ["clip", "adacl-literal/auto", "adacl-calibrated/auto"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--paths"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--discoveries", "gda", "--memory"])


def test_bench_loss_discovery_inputs_are_a_training_steps():
    bench = bench_script("bench_loss")
    tokens = bench.make_tokens(64)
    assert tokens.shape == (64, 77) and bool((tokens == bench.make_tokens(64)).all())  # deterministic
    assert (tokens[:, 0] == bench.START_TOKEN).all() and ((tokens == bench.END_TOKEN).sum(1) == 1).all()
    words = [set(row[1 : row.tolist().index(bench.END_TOKEN)].tolist()) for row in tokens]
    # Jaccard of the word sets: captions of one cluster share most words, of two clusters few.
    siblings, others = [], []
    for i in range(64):
        for j in range(64):
            if i != j:
                share = len(words[i] & words[j]) / len(words[i] | words[j])
                (siblings if i // bench.CLUSTER_SIZE == j // bench.CLUSTER_SIZE else others).append(share)
    assert min(siblings) > 0.3 and sum(others) / len(others) < 0.1
    # The persistence memory moves at each step's commit(), as in training: every pair of the batch once.
    loss = bench.build_loss("adaclw/persistence")
    image, text = bench.make_features(32, 8, "cpu", "trained-50")
    for _ in range(2):
        bench.run_case("adaclw/persistence", loss, image, text, 50.0, tokens[:32])
        assert len(loss.memory) == 32 * 31


def test_bench_costs_counts_every_registered_loss_beside_clip_loss(tmp_path):
    from open_clip_adacl import clone_signals, list_losses

    bench = bench_script("bench_costs")
    output = tmp_path / "costs.md"
    rows = bench.main(["--sizes", "24", "--dim", "8", "--repeats", "1", "--output", str(output)])
    names = [row["loss"] for row in rows]
    expected = {"ClipLoss", "adacl (calibrated)", "adacl (literal)"} | {f"adaclw/{s}" for s in clone_signals.SIGNALS}
    assert names[0] == "ClipLoss" and set(names) == expected | (set(list_losses()) - {"adacl", "adaclw"})
    base = rows[0]
    assert base["ops_ratio"] == base["passes_ratio"] == base["time_ratio"] == 1.0 and base["host_waits"] == {}
    assert all(row["ops"] > 0 and row["square_passes"] > 0 and row["seconds"] > 0 for row in rows)
    with pytest.raises(SystemExit):  # a case that is none, or CUDA where there is none (one line, argparse's)
        bench.parse_args(["--losses", "adaclw/nope"])
    report = output.read_text()
    assert "| ClipLoss | 24 | " in report and "against ClipLoss in the same run" in report and "; code " in report
    # The counter sees a host wait where there is one, and counts the N x N traffic of what it sees.
    step_costs = bench_script("step_costs")
    import torch

    square = torch.ones(24, 24)
    with step_costs.counting_host_reads(costs_of=24) as reads:
        (square * 2)[square > 0].sum().item()
        torch.arange(3).repeat_interleave(2)  # fixed output size: no wait
    assert reads == {"aten.index with a boolean mask": 1, "Tensor.item": 1}
    # mul: in and out; gt: in, and a bool out; index: the float and the bool in, every entry out; sum: in
    assert reads.costs.square_passes == 1 + 1 + 1 + 0.25 + 1 + 0.25 + 1 + 1
