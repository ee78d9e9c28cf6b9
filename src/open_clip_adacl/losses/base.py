"""What every registered loss shares.

`Loss` fixes the interface the trainer relies on (OpenCLIP's `ClipLoss.forward` signature plus the per-sample
inputs `sample_index`, `family` and `text_tokens`; `stats`, `on_epoch_start`, `commit`)
and what a loss declares about itself: its `Options` dataclass and its capabilities.
`ContrastiveLoss` is InfoNCE over the global batch with OpenCLIP's `ClipLoss` semantics with full
logits and with `local_loss`; losses that change the logits (AdaCL's positive margins, GloFND's masks,
FNE's weights, the oracle's family weights) override `adjust_logits` only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..distributed import RowGroup, gather_batch, gather_no_grad
from .options import DistributedSetup, LossOptions, SampleStateOptions

DIRECTIONS = ("i2t", "t2i")
FAMILY_FIELD = "family"  # the json field the trainer reads family ids from, unless a loss's options name another


@dataclass(frozen=True)
class MechanismStats:
    """The per-step stats a loss comparison summarises per run, both directions pooled, as `<prefix>/<stat>`:
    `fractions` as the share of logged steps (how often a guard or bound fired), `spreads` as their mean and
    standard deviation (`<prefix>/<stat>_mean|_std`). A loss declares them so that a report reads its mechanism
    without naming the loss."""

    prefix: str
    fractions: Tuple[str, ...] = ()
    spreads: Tuple[str, ...] = ()


class Loss(nn.Module):
    """Interface of every registered loss.

    forward(image_features, text_features, logit_scale, logit_bias=None, *, sample_index=None, family=None,
    text_tokens=None, output_dict=False) returns the loss (or `{"contrastive_loss": loss}`). The keyword
    inputs are this rank's samples' global indices, family ids (-1: none) and captions' token ids; every loss
    accepts them all and reads what it declares: `needs_sample_index`, `needs_family` or `takes_family` (the
    trainer reads families from the data's json only for such a loss), `takes_text_tokens`. After each forward,
    `stats` holds 0-dim tensors for logging; they are never part of the loss. A caller that will not read a
    step's stats sets `wants_stats` False before it (the trainer does on the steps it does not log), and a
    loss whose stats cost passes over the N x N logits may then leave them out; set it alike on every rank,
    since stats may reduce over the ranks. State that must
    survive a resume lives in buffers, so `state_dict()` checkpoints it.

    State moves in two phases. A training forward computes the update of the loss's state from
    its batch (`stage_update`) but leaves the state as it was; `commit()` applies the update
    staged by the latest forward. Every forward first drops an update staged before it and not
    committed. The trainer calls `commit()` once per optimizer step, after the update, and not
    for a step skipped as non-finite (the state then stays unchanged). So with `--accum-freq k`,
    where the loss runs k times over the same accumulated batch, the state moves once per step,
    exactly as for one batch k times larger. Code that drives a loss by hand calls `commit()`
    after each step; without it the state never moves, and the loss warns once (`UncommittedStateWarning`)
    when UNCOMMITTED_WARNING_AFTER forwards in a row have dropped an update staged before them.
    """

    # What a loss declares about itself (the registry checks the declarations).
    Options: ClassVar[Type[LossOptions]] = LossOptions  # its options, declared once
    needs_logit_bias: ClassVar[bool] = False  # the model must have a logit_bias (built as OpenCLIP's --siglip)
    needs_sample_index: ClassVar[bool] = False  # forward needs sample_index; Options derive SampleStateOptions
    needs_family: ClassVar[bool] = False  # forward needs family= (each sample's family id, -1: none)
    # forward reads family= where the data carries families, only for its stats (what its discovery found of them)
    takes_family: ClassVar[bool] = False
    takes_text_tokens: ClassVar[bool] = False  # forward reads text_tokens= (this rank's captions' token ids)
    keeps_state: ClassVar[bool] = False  # buffers that move across steps (checkpointed, `commit()`ed)
    # Stats shown on the trainer's console line (by name after the direction); None: all of them.
    # Every stat still reaches metrics.jsonl and tensorboard.
    console_stats: ClassVar[Optional[Tuple[str, ...]]] = None
    # Stats a loss comparison summarises per run (how often the loss's mechanism acted); none by default.
    mechanism_stats: ClassVar[Optional[MechanismStats]] = None
    # Plots of this loss's stats that the trainer redraws in the run folder at each epoch end, by the names
    # the trainer knows them by ("margins": AdaCL's margins over training); none by default.
    plots: ClassVar[Tuple[str, ...]] = ()
    # A trainer that accumulates k micro-batches per step drops k - 1 staged updates between two commits; a
    # caller that drops this many in a row never commits.
    UNCOMMITTED_WARNING_AFTER: ClassVar[int] = 64

    def __init__(self, options: Optional[LossOptions] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__()
        options = self.Options() if options is None else options
        if type(options) is not self.Options:
            raise TypeError(f"{type(self).__name__} takes {self.Options.__name__}, got {type(options).__name__}")
        self.options = options
        self.dist = dist
        self.stats: Dict[str, torch.Tensor] = {}
        self.wants_stats = True
        self._staged_updates: List[Callable[[], None]] = []
        self._drops_since_commit = 0  # forwards since the last commit() that dropped a staged update
        self.register_forward_pre_hook(_drop_staged_updates)

    def stage_update(self, update: Callable[[], None]) -> None:
        """Register a write of this forward's state update; `commit()` runs it (under no_grad)."""
        self._staged_updates.append(update)

    def commit(self) -> None:
        """Apply the state update staged by the latest forward (nothing when there is none)."""
        updates, self._staged_updates = self._staged_updates, []
        self._drops_since_commit = 0
        with torch.no_grad():
            for update in updates:
                update()

    def on_epoch_start(self, epoch: int) -> None:
        """Called by the trainer before each epoch (epochs count from 0)."""

    def reset_state(self) -> None:
        """Forget the state kept across steps (the trainer calls it to restart that state on resume)."""

    def journals(self) -> Dict[str, Any]:
        """JSON-ready journals of how this loss ran that are not per-step stats (choices it made once, say), by
        name: the trainer keeps each as <name>.json in the run folder, rewritten when it changes (it asks after
        every step). None by default."""
        return {}

    def idle_options(self, global_batch: int) -> List[str]:
        """Why this loss's options make it change nothing on global batches of `global_batch` samples, a line each
        naming the options and the fix (none by default): the trainer warns with each once, before any step."""
        return []

    def reads_family(self) -> bool:
        """Whether the trainer should read each sample's family id from the data for this loss (-1 where a sample
        has none): a loss that needs them, or takes them for its stats."""
        return self.needs_family or self.takes_family

    def family_field(self) -> str:
        """The json field of the data the trainer reads this loss's family ids from (`FAMILY_FIELD` unless the
        loss's options name another: a field listing group ids gives each sample several, `sibling_mask`)."""
        return getattr(self.options, "family_field", FAMILY_FIELD)

    def reads_text_tokens(self) -> bool:
        """Whether this loss, under its options, reads the token ids it is passed (the batch gathers them over
        the ranks only then); a loss that `takes_text_tokens` may not under every option."""
        return self.takes_text_tokens

    def reads_sample_index(self) -> bool:
        """Whether this loss, under its options, reads the samples' global indices (`sample_index=`): one that
        `needs_sample_index` always, one whose options keep per-sample state (AdaCL's memory bank) then; a
        caller whose batches carry no ids (stock open_clip_train) cannot train such a loss."""
        options = self.options
        return self.needs_sample_index or (isinstance(options, SampleStateOptions) and options.keeps_sample_state)

    @staticmethod
    def wrap_output(loss: torch.Tensor, output_dict: bool):
        return {"contrastive_loss": loss} if output_dict else loss


class UncommittedStateWarning(UserWarning):
    """A loss's state does not move: its caller never calls `commit()` after an optimizer step."""


def _drop_staged_updates(loss: Loss, inputs) -> None:
    """Forward pre-hook: an update staged by an earlier forward and not committed never applies later."""
    if loss._staged_updates:
        loss._drops_since_commit += 1
        if loss._drops_since_commit == loss.UNCOMMITTED_WARNING_AFTER:
            warnings.warn(
                f"{type(loss).__name__}: {loss._drops_since_commit} training forwards in a row dropped the state "
                "update of the one before, never committed, so the loss's state does not move: call loss.commit() "
                "after each optimizer step (the trainer and the open_clip_train plug-in do; docs/losses.md)",
                UncommittedStateWarning,
            )
    loss._staged_updates = []


@dataclass
class GlobalBatch:
    """The similarities this rank holds, and what a loss needs to reason about the global batch.

    Rows are queries, columns the N candidates of the global batch. With full logits (OpenCLIP's
    default) every rank holds all N rows; with `local_loss` a rank holds its own b rows.
    """

    image_features: torch.Tensor  # rows x D, this rank's queries (image side)
    text_features: torch.Tensor  # rows x D
    all_image_features: torch.Tensor  # N x D
    all_text_features: torch.Tensor  # N x D
    logits_per_image: torch.Tensor  # rows x N, logit_scale * cos (+ logit_bias)
    logits_per_text: torch.Tensor  # rows x N
    labels: torch.Tensor  # rows, the positive column of each row (its global row index)
    logit_scale: torch.Tensor  # 0-dim, already exponentiated
    rows: RowGroup  # reductions over the ranks sharing the rows
    sample_index: Optional[torch.Tensor]  # N, global sample index of each column, or None
    logit_bias: Optional[torch.Tensor] = None  # 0-dim, or None
    family: Optional[torch.Tensor] = None  # N (or N x K group ids) family id of each column (-1: none), or None
    text_tokens: Optional[torch.Tensor] = None  # N x L, each column's caption token ids, or None

    def to_logits(self, similarity: torch.Tensor) -> torch.Tensor:
        """Cosine similarities mapped to this batch's logit space (`logit_scale * s + logit_bias`)."""
        logits = self.logit_scale * similarity
        return logits if self.logit_bias is None else logits + self.logit_bias

    def to_similarity(self, logits: torch.Tensor) -> torch.Tensor:
        """The inverse of `to_logits`: the cosine similarities behind `logits`."""
        if self.logit_bias is not None:
            logits = logits - self.logit_bias
        return logits / self.logit_scale

    def logits(self, direction: str) -> torch.Tensor:
        return self.logits_per_image if direction == "i2t" else self.logits_per_text

    def positive_mask(self) -> torch.Tensor:
        """rows x N, True at each row's positive column."""
        columns = torch.arange(self.logits_per_image.shape[1], device=self.labels.device)
        return columns[None, :] == self.labels[:, None]

    def sibling_mask(self) -> torch.Tensor:
        """rows x N, True where column j is a negative of row i's family: with one id per sample, the same id
        (never -1); with K group ids per sample (N x K), the same id in any one of the K places (the k-th id of
        one sample against the k-th of the other: the groups of each kind are their own)."""
        if self.family is None:
            raise ValueError("no family ids: pass family= (the trainer reads them from the data's json)")
        family = self.family.to(self.labels.device)
        if family.dim() == 1:
            family = family[:, None]
        row_family = family[self.labels]
        same = ((row_family[:, None, :] == family[None, :, :]) & (row_family[:, None, :] >= 0)).any(dim=2)
        return same & ~self.positive_mask()

    def query_text_tokens(self) -> Optional[torch.Tensor]:
        """rows x L: the token ids of this rank's queries (all N when every rank holds every row), or None."""
        if self.text_tokens is None or not self.rows.split_across_ranks:
            return self.text_tokens
        return self.text_tokens[self.labels]

    def query_features(self, direction: str) -> torch.Tensor:
        return self.image_features if direction == "i2t" else self.text_features

    def candidate_features(self, direction: str) -> torch.Tensor:
        return self.all_text_features if direction == "i2t" else self.all_image_features


class ContrastiveLoss(Loss):
    """Symmetric InfoNCE exactly as OpenCLIP's `ClipLoss` computes it.

    A loss that `shares_logit_matmul` takes, with one process, the text-to-image logits as the
    image-to-text ones transposed, as OpenCLIP's gathered path without `local_loss` does: one matmul
    instead of two in the forward pass and two instead of four in the backward (AdaCL's cost:
    docs/THROUGHPUT.md). The project's losses do; `clip` does not unless asked (its `shared_matmul`
    option), since `open_clip.ClipLoss` computes them by a second matmul, whose bits differ by rounding.
    The losses that equal ClipLoss in a limit (a weight of one, alpha zero) are held bit for bit to
    `clip` with `shared_matmul`.
    """

    shares_logit_matmul: ClassVar[bool] = True

    def build_batch(
        self,
        image_features,
        text_features,
        logit_scale,
        logit_bias=None,
        sample_index=None,
        family=None,
        text_tokens=None,
    ) -> GlobalBatch:
        dist = self.dist
        if dist.world_size > 1:
            all_image, all_text = gather_batch(
                image_features,
                text_features,
                rank=dist.rank,
                world_size=dist.world_size,
                local_loss=dist.local_loss,
                gather_with_grad=dist.gather_with_grad,
            )
            if dist.local_loss:
                logits_per_image = logit_scale * image_features @ all_text.T
                logits_per_text = logit_scale * text_features @ all_image.T
                queries_image, queries_text = image_features, text_features
            else:
                logits_per_image = logit_scale * all_image @ all_text.T
                logits_per_text = logits_per_image.T
                queries_image, queries_text = all_image, all_text
        else:
            all_image, all_text = image_features, text_features
            queries_image, queries_text = image_features, text_features
            logits_per_image = logit_scale * image_features @ text_features.T
            if self.shares_logit_matmul:
                logits_per_text = logits_per_image.T
            else:
                logits_per_text = logit_scale * text_features @ image_features.T
        if logit_bias is not None:
            logits_per_image = logits_per_image + logit_bias
            logits_per_text = logits_per_text + logit_bias

        num_rows = logits_per_image.shape[0]
        labels = torch.arange(num_rows, device=image_features.device, dtype=torch.long)
        if dist.splits_rows:
            labels = labels + num_rows * dist.rank
        return GlobalBatch(
            image_features=queries_image,
            text_features=queries_text,
            all_image_features=all_image,
            all_text_features=all_text,
            logits_per_image=logits_per_image,
            logits_per_text=logits_per_text,
            labels=labels,
            logit_scale=logit_scale,
            rows=RowGroup(split_across_ranks=dist.splits_rows),
            sample_index=gather_no_grad(sample_index, dist.world_size),
            logit_bias=logit_bias,
            family=gather_no_grad(family, dist.world_size),
            text_tokens=gather_no_grad(text_tokens, dist.world_size) if self.reads_text_tokens() else None,
        )

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        """The logits the cross-entropy sees for `direction`; the identity for plain CLIP."""
        return batch.logits(direction)

    def direction_loss(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        """Mean cross-entropy of one direction's rows against their positives.

        Override `adjust_logits` to change the logits; override this only when the loss is not a
        cross-entropy over a materialised logit matrix (AdaCL avoids an N x N copy this way).
        """
        return F.cross_entropy(self.adjust_logits(batch, direction), batch.labels)

    def symmetric_loss(self, batch: GlobalBatch) -> torch.Tensor:
        """ClipLoss's average of the image-to-text and text-to-image losses."""
        return (self.direction_loss(batch, "i2t") + self.direction_loss(batch, "t2i")) / 2

    def forward(
        self,
        image_features,
        text_features,
        logit_scale,
        logit_bias=None,
        *,
        sample_index=None,
        family=None,
        text_tokens=None,
        output_dict=False,
    ):
        batch = self.build_batch(
            image_features, text_features, logit_scale, logit_bias, sample_index, family, text_tokens
        )
        self.stats = {}
        return self.wrap_output(self.symmetric_loss(batch), output_dict)


class EpochGatedLoss(ContrastiveLoss):
    """A `ContrastiveLoss` whose adjustment starts at epoch `options.start_epoch`, in training mode
    only; before that, and in evaluation passes, it is plain InfoNCE (the peers' warm-up epochs)."""

    def __init__(self, options: Optional[LossOptions] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        self.epoch = 0

    def on_epoch_start(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def active(self) -> bool:
        """Whether this forward stages a state update and adjusts the logits."""
        return self.training and self.epoch >= self.options.start_epoch
