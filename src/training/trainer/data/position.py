"""Where the training stream stands, as a checkpoint component: the loader is built from it
(`build_train_data(epoch=position.epoch)` with `DataConfig.skip_batches=position.batches_in_epoch`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping


@dataclass
class DataPosition:
    """Epoch `epoch`, `batches_in_epoch` batches (each rank's, all ranks alike) into it."""

    epoch: int = 0
    batches_in_epoch: int = 0

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])

    def next_epoch(self) -> None:
        self.epoch += 1
        self.batches_in_epoch = 0

    def in_batches_of(self, old_global_batch: int, new_global_batch: int, accum_freq: int) -> int:
        """The batch of this epoch, in global batches of `new_global_batch` samples, that follows as many
        samples as `batches_in_epoch` global batches of `old_global_batch` (rounded down to whole optimizer
        steps of `accum_freq` batches)."""
        batches = self.batches_in_epoch * old_global_batch // new_global_batch
        return batches - batches % accum_freq
