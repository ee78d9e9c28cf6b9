"""`python -m training.discover`: the pairs AdaCL's discovery flags as clone negatives in a dataset.

    python -m training.discover --checkpoint logs/RUN/checkpoints/epoch_8.pt \\
        --data 'demo/data/train/shard-{000000..000015}.tar' --batch-size 128 --output discover/
    # or an export / an OpenCLIP model: --model local-dir:export | --model ViT-B-32 --pretrained TAG
    torchrun --nproc_per_node 8 -m training.discover -- ...   # global batches of 8 x --batch-size

It streams the data in order with the trainer's readers and checks, encodes each global batch,
and runs the loss's own discovery on it (`open_clip_adacl.discovery.clone_pairs`: salient rows, the
two Gaussian fits, the candidate region, with the `--adacl-*` options), so what it flags is what a
training step on that batch would flag. It writes into `--output`: `pairs.jsonl` (streamed; a killed
run continues with `--continue`), `index.html` (a static page: the top pairs side by side, the fits
and the flagged fraction per batch), `summary.json` and a console table (flagged fraction,
candidates per row, and the precision and recall against ground-truth families, a proxy, when the
samples carry them; with their facts, the kept pairs per label: one family or two, and how many facts
apart). docs/discover.md has the details.

Modules: `data` (in-order global batches), `model` (loading), `batch` (one batch through the
discovery), `facts` (how many facts two captions differ in, and the words that say it), `store` (the
output folder and resume), `report` (summary, plots, page), `cli`.
"""

from .cli import main

__all__ = ["main"]
