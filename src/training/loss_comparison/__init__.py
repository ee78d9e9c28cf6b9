"""The loss comparison: the same tiny model trained with each loss over several seeds, one report.

`python -m training.loss_comparison` (`cli`; scripts/compare_losses.py, scripts/clone_study.py call it). By
responsibility, each module using only those before it:

- `variants`: the loss-variant mini-language (`adacl:mode=literal,...`) and its trainer flags;
- `data`: the budget every run shares (`QUICK`, `FULL`) and the demo data (`training.synthetic_scenes`);
- `preregistration`: the primary endpoint, equivalence margin and reference, from flags or a committed file;
- `jobs`: one (variant, seed) each: its trainer arguments, its process (train with `training`,
  evaluate with `training.evaluation`, on the demo's sets or the user's) and its JSON record;
- `cluster`: the jobs as torchrun scripts, a SLURM array script and a jobs list (`--emit-jobs`);
- `stats`: verdicts (ok, collapsed, nonfinite, failed), means over ok runs, paired differences, the
  primary endpoint's verdict (helps, hurts, no effect, inconclusive) and Holm-corrected secondary tests;
- `report`: the Markdown report, its plot and CSVs;
- `runner`: a whole comparison (data, jobs in parallel, report), its jobs emitted, and `--report-only`;
- `cli`: the command line.

It sits on top: nothing in `training`, `training.evaluation`, `training.synthetic_scenes` or `open_clip_adacl` imports it.
"""
