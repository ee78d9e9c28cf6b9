"""The loss comparison: the same tiny model trained with each loss over several seeds, one report.

`python -m loss_comparison` (`cli`; scripts/compare_losses.py, scripts/clone_study.py call it). By
responsibility, each module using only those before it:

- `variants`: the loss-variant mini-language (`adacl:mode=literal,...`) and its trainer flags;
- `data`: the budget every run shares (`QUICK`, `FULL`) and the demo data (`synthetic_scenes`);
- `jobs`: one (variant, seed) each: its trainer arguments, its process (train with `training`,
  evaluate with `evaluation`) and its JSON record;
- `stats`: verdicts (ok, collapsed, nonfinite, failed), means over ok runs, paired differences;
- `report`: the Markdown report, its plot and CSVs;
- `runner`: a whole comparison (data, jobs in parallel, report) and `--report-only`;
- `cli`: the command line.

It sits on top: nothing in `training`, `evaluation`, `synthetic_scenes` or `open_clip_adacl` imports it.
"""
