"""Everything a run writes into `<logs>/<name>/` and reads back: the folder's layout and its reader
(`layout.RunDir`), its lock, records that outlive a full disk (`safe_write`), the console log and
metrics.jsonl (`logger`), checkpoint files and their digests, the records kept in step with a resume
(`records`), the code a run ran (`provenance`) and the margins plot."""
