"""Everything a run writes into `<logs>/<name>/` and reads back: the folder's layout and its reader
(`layout.RunDir`), its lock, files whose writes outlive a full disk (`safe_write`), the console log and
metrics.jsonl (`logger`), checkpoint files and their digests, metrics.jsonl and results.jsonl cut back to
the step a launch resumes from (`rewind`), the code a run ran (`provenance`) and the margins plot."""
