"""The library's losses in stock OpenCLIP 3.3.0's trainer, for a user who keeps `open_clip_train`.

    python -m open_clip_adacl.integrations.open_clip_train --loss adacl [--adacl-OPTION ...] <open_clip_train flags>
    torchrun --nproc_per_node 8 -m open_clip_adacl.integrations.open_clip_train -- --loss adacl ... <flags>

runs `open_clip_train.main.main` (the installed open_clip_torch, not a copy) with `--loss NAME` and the loss's
option flags, named as `python -m training.main` names them (`open_clip_adacl.losses.flags`); every other flag is
stock's and means what it means there. Without `--loss` stock's own losses train, unchanged.

Stock's trainer knows nothing of the loss contract (`open_clip_adacl.losses.base.Loss`), so for the length of the
call this module replaces four names of `open_clip_train.main` and restores them afterwards:

- `parse_args`: stock's parser, then the loss recorded in the namespace (`loss`, `loss_options`: params.txt lists
  them), `--siglip` set for a loss that needs a logit bias (stock builds the model with SigLIP's init then), and a
  flag stock combines with a loss it cannot feed refused in one line (`--horovod`, distillation, CoCa models,
  `--local-loss` without `--gather-with-grad`, whose gradient is wrong);
- `create_loss`: the project's loss for `args.rank` / `args.world_size` / `--local-loss` / `--gather-with-grad`,
  with the state of the checkpoint `--resume` named, called by stock's step as `loss(**model_out,
  output_dict=True)` and handed the captions' token ids of the step's micro-batches when it `takes_text_tokens`
  (stock's batches are `(images, texts)`: there are no sample ids or family ids to hand, so a loss that reads them
  is refused before any work, by its capabilities: `needs_family`, `reads_sample_index()`);
- `train_one_epoch`: stock's, after `loss.on_epoch_start(epoch)`, with `loss.commit()` after every optimizer step
  (an optimizer step hook: a step the fp16 GradScaler skips commits nothing), so with `--accum-freq k` the state
  moves once per step, as for one batch k times larger (stock runs the loss k times over the accumulated batch,
  as our trainer does); the loss's stats are not computed, since stock logs none of them;
- `pt_load`: stock's, keeping the loss state a checkpoint holds for `create_loss`.

The loss's `state_dict()` rides in stock's checkpoints (epoch_N.pt, epoch_latest.pt) inside the optimizer's state,
under `CHECKPOINT_KEY` (an optimizer state-dict hook: stock builds its checkpoint dict inline), with the loss's name
and options; `--resume` restores it, and refuses a checkpoint of another loss. Stock's evaluation and clip-benchmark
read `state_dict` only, so they load these checkpoints as any other.

On the CPU, stock wraps the model in `DistributedDataParallel(model, device_ids=[cpu])`, which torch refuses; for the
call `torch.nn.parallel.DistributedDataParallel` is a subclass that drops a device list of CPUs only (the only change
to torch, so several gloo ranks on CPUs train; on GPUs it does nothing).

A fork of open_clip_train whose main module keeps these four names takes the same changes:
`with patched_open_clip_train("adacl", {"mode": "literal"}, module=my_fork.main): my_fork.main.main(argv)`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import open_clip_train.main as stock_main
import torch
from torch.nn.parallel import DistributedDataParallel

from ..losses import DistributedSetup, Loss, LossOptions, get_loss_class
from ..losses.flags import add_loss_flag, given_loss_options, loss_flags, loss_line, loss_option_flag
from ..losses.registry import LOSSES, accepted_loss_names

CHECKPOINT_KEY = "open_clip_adacl_loss"  # in a checkpoint's "optimizer" entry: {"loss", "options", "state_dict"}
PROG = "python -m open_clip_adacl.integrations.open_clip_train"
OUR_TRAINER = "python -m training.main (the same flags)"


class PluginError(ValueError):
    """A run stock open_clip_train cannot do with this loss; the message says why and what to do instead."""


# ---------------------------------------------------------------------------------------------
# The loss as stock's train step calls it
# ---------------------------------------------------------------------------------------------


class StockLossCall:
    """The loss as stock's `train_one_epoch` calls it, `loss(**model_out, output_dict=True)`, where model_out holds
    the features, `logit_scale` and, for a SigLIP model, `logit_bias`: a loss that `takes_text_tokens` also gets the
    token ids of the step's micro-batches, in the order stock concatenates their features."""

    def __init__(self, loss: Loss):
        self.loss = loss
        self.step_texts: List[torch.Tensor] = []  # each micro-batch's token ids this step (`RecordingLoader`)

    def __call__(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False):
        inputs = {"text_tokens": self.step_tokens(image_features)} if self.loss.takes_text_tokens else {}
        return self.loss(image_features, text_features, logit_scale, logit_bias, output_dict=output_dict, **inputs)

    def step_tokens(self, image_features: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat(self.step_texts) if self.step_texts else image_features.new_empty(0, dtype=torch.long)
        if len(tokens) != len(image_features):
            raise RuntimeError(
                f"the step's captions ({len(tokens)} token rows) do not match its features ({len(image_features)} "
                "rows): stock's train step no longer draws its batches as this plug-in expects (open_clip_torch 3.3)"
            )
        return tokens.to(image_features.device, non_blocking=True)


class RecordingLoader:
    """Stock's training dataloader, handing each batch's token ids to `call` as stock's step draws it: the step's
    list starts again at every `accum_freq`-th batch (the first micro-batch of a step)."""

    def __init__(self, dataloader, call: StockLossCall, accum_freq: int):
        self._dataloader, self._call, self._accum_freq = dataloader, call, accum_freq

    def __iter__(self) -> Iterator:
        for index, batch in enumerate(self._dataloader):
            if index % self._accum_freq == 0:
                self._call.step_texts = []
            self._call.step_texts.append(batch[1])
            yield batch

    def __len__(self) -> int:
        return len(self._dataloader)

    def __getattr__(self, name: str) -> Any:  # num_batches, num_samples, ...
        return getattr(self._dataloader, name)


# ---------------------------------------------------------------------------------------------
# The plug-in: what replaces stock's names for one run
# ---------------------------------------------------------------------------------------------


class LossPlugin:
    """One run's loss in stock's trainer: its name and options, checked before any work (`check`), and the
    functions that stand in for stock's `parse_args`, `create_loss`, `train_one_epoch` and `pt_load`."""

    def __init__(self, loss_name: str, options: LossOptions):
        self.name = LOSSES.canonical(loss_name)
        self.cls = get_loss_class(self.name)
        self.options = options
        self.loss: Optional[Loss] = None
        self.call: Optional[StockLossCall] = None
        self._pending_state: Optional[Dict[str, Any]] = None  # the loss state of the checkpoint --resume named
        self._hooked: List[Any] = []  # the optimizer hooks' handles
        self._hooked_optimizer = None
        self.stock: Dict[str, Callable] = {}  # stock's train_one_epoch and pt_load (`patched_open_clip_train`)

    @classmethod
    def build(cls, loss_name: str, given: Mapping[str, Any]) -> "LossPlugin":
        """The plug-in for `loss_name` with the options `given` (by option name, presets filled in), checked."""
        name = LOSSES.canonical(loss_name)
        loss_cls = get_loss_class(name)
        unfed = [what for what, needed in (("family id", loss_cls.needs_family),) if needed]
        if loss_cls.needs_sample_index:
            unfed.append("index (sample_index)")
        if unfed:
            raise PluginError(_unfed_message(f"--loss {name}", unfed))
        try:
            options = loss_cls.Options.build(**given)
        except ValueError as error:
            raise PluginError(loss_line(name, error)) from None
        plugin = cls(name, options)
        if loss_cls(options).reads_sample_index():  # an option that keeps per-sample state
            raise PluginError(_unfed_message(f"--loss {name}{plugin.changed_flags()}", ["index (sample_index)"]))
        return plugin

    def changed_flags(self) -> str:
        """' --adaclw-discovery persistence ...': this run's options that are not the loss's defaults, as flags."""
        return "".join(
            f" {loss_option_flag(self.name, spec)} {getattr(self.options, spec.name)}"
            for spec in self.options.specs()
            if getattr(self.options, spec.name) != spec.default
        )

    def option_values(self) -> Dict[str, Any]:
        return {spec.name: getattr(self.options, spec.name) for spec in self.options.specs()}

    # --- stock's parse_args ----------------------------------------------------------------------------------

    def check_stock_args(self, args: argparse.Namespace) -> None:
        """Refuse stock flags this loss cannot train with, then record the loss in `args` (params.txt)."""
        refused = {
            "--horovod": args.horovod and "the loss gathers over torch.distributed: launch with torchrun or srun",
            "--distill-model": (
                args.distill_model is not None and "distillation needs stock's DistillClipLoss: drop --loss"
            ),
            f"--model {args.model}": "coca" in args.model.lower() and "CoCa needs stock's CoCaLoss: drop --loss",
            "--local-loss without --gather-with-grad": (
                args.local_loss
                and not args.gather_with_grad
                and "gives a wrong gradient with several ranks (each rank's features lose the gradient of the "
                "others' logits): add --gather-with-grad"
            ),
            "--siglip": (
                args.siglip
                and not self.cls.needs_logit_bias
                and f"builds stock's SigLipLoss and a logit bias, which --loss {self.name} does not use: drop "
                "--siglip (--loss siglip is the project's sigmoid loss)"
            ),
        }
        for flag, reason in refused.items():
            if reason:
                raise PluginError(f"{flag} with --loss {self.name}: {reason}")
        args.siglip = self.cls.needs_logit_bias  # the model gets a logit bias, with SigLIP's init (stock's main)
        args.loss = self.name
        args.loss_options = self.option_values()

    # --- stock's create_loss ---------------------------------------------------------------------------------

    def create_loss(self, args: argparse.Namespace) -> StockLossCall:
        dist = DistributedSetup(
            rank=args.rank,
            world_size=args.world_size,
            local_loss=args.local_loss,
            gather_with_grad=args.gather_with_grad,
        )
        self.loss = self.cls(self.options, dist).to(args.device)
        if self._pending_state is not None:
            try:
                self.loss.load_state_dict(self._pending_state)
            except (RuntimeError, ValueError) as error:
                first_line = str(error).strip().splitlines()[0]
                raise PluginError(
                    f"the checkpoint's loss state does not load into --loss {self.name}{self.changed_flags()}: "
                    f"{first_line}; resume with the options it was trained with"
                ) from None
            self._pending_state = None
        self.loss.wants_stats = False  # stock logs none of the loss's stats (the same on every rank)
        self.call = StockLossCall(self.loss)
        return self.call

    # --- stock's train_one_epoch -----------------------------------------------------------------------------

    def train_one_epoch(self, model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=None):
        if loss is not self.call:
            raise RuntimeError("stock's train_one_epoch got another loss than this plug-in's create_loss made")
        self._hook(optimizer)
        self.loss.on_epoch_start(epoch)
        if self.loss.takes_text_tokens:
            data = {
                **data,
                "train": dataclasses.replace(
                    data["train"], dataloader=RecordingLoader(data["train"].dataloader, self.call, args.accum_freq)
                ),
            }
        return self.stock["train_one_epoch"](
            model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=tb_writer
        )

    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """`commit()` after each optimizer step; the loss's state in each optimizer state dict (the checkpoint)."""
        if self._hooked_optimizer is optimizer:
            return
        self.unhook()
        self._hooked_optimizer = optimizer
        self._hooked = [
            optimizer.register_step_post_hook(lambda *_: self.loss.commit()),
            optimizer.register_state_dict_post_hook(self._with_loss_state),
        ]

    def unhook(self) -> None:
        for handle in self._hooked:
            handle.remove()
        self._hooked, self._hooked_optimizer = [], None

    def _with_loss_state(self, optimizer, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        state_dict[CHECKPOINT_KEY] = {
            "loss": self.name,
            "options": self.option_values(),
            "state_dict": self.loss.state_dict(),
        }
        return state_dict

    # --- stock's pt_load -------------------------------------------------------------------------------------

    def pt_load(self, file_path, map_location=None):
        """Stock's load; a training checkpoint's loss state is taken out of its optimizer entry, for `create_loss`
        (and a checkpoint of another loss refused)."""
        checkpoint = self.stock["pt_load"](file_path, map_location=map_location)
        optimizer_state = checkpoint.get("optimizer") if isinstance(checkpoint, dict) else None
        if not isinstance(optimizer_state, dict):
            return checkpoint  # a bare model checkpoint (fine-tuning, evaluation): no loss state to continue
        saved = optimizer_state.pop(CHECKPOINT_KEY, None)
        if saved is None:
            if self.cls.keeps_state:
                logging.warning(
                    f"{file_path} holds no state of --loss {self.name} (written without this plug-in): the loss's "
                    "state starts afresh"
                )
            return checkpoint
        if LOSSES.canonical(saved["loss"]) != self.name:
            raise PluginError(
                f"{file_path} was trained with --loss {saved['loss']}, this run has --loss {self.name}: resume "
                f"with --loss {saved['loss']}, or start from its weights with --pretrained {file_path}"
            )
        changed = {
            name: (value, saved["options"].get(name))
            for name, value in self.option_values().items()
            if saved["options"].get(name) != value
        }
        if changed:
            logging.warning(
                f"{file_path} was trained with other --loss {self.name} options: "
                + ", ".join(f"{name} {old!r} -> {new!r}" for name, (new, old) in changed.items())
            )
        self._pending_state = saved["state_dict"]
        logging.info(f"=> the loss state of --loss {self.name} continues from '{file_path}'")
        return checkpoint


def _unfed_message(what: str, inputs: Sequence[str]) -> str:
    return (
        f"{what} reads each sample's {' and '.join(inputs)}, which stock open_clip_train's batches (images, texts) "
        f"do not carry; train it with {OUR_TRAINER}"
    )


# ---------------------------------------------------------------------------------------------
# Running stock's main with the plug-in
# ---------------------------------------------------------------------------------------------


class CpuDistributedDataParallel(DistributedDataParallel):
    """DDP as stock's main builds it, `DistributedDataParallel(model, device_ids=[device])`, with a device list of
    CPUs only dropped: torch refuses device_ids for a CPU module, and gloo ranks on CPUs need none."""

    def __init__(self, module, device_ids=None, *args, **kwargs):
        if device_ids is not None and all(torch.device(device).type == "cpu" for device in device_ids):
            device_ids = None
        super().__init__(module, device_ids, *args, **kwargs)


@contextlib.contextmanager
def cpu_ddp() -> Iterator[None]:
    """`torch.nn.parallel.DistributedDataParallel` is `CpuDistributedDataParallel` inside, restored afterwards."""
    parallel = torch.nn.parallel
    original = parallel.DistributedDataParallel
    parallel.DistributedDataParallel = CpuDistributedDataParallel
    try:
        yield
    finally:
        parallel.DistributedDataParallel = original


@contextlib.contextmanager
def patched_open_clip_train(
    loss_name: str, options: Optional[Mapping[str, Any]] = None, *, module=stock_main
) -> Iterator[LossPlugin]:
    """Inside, `module.main(argv)` (stock's `open_clip_train.main`, or a fork's module with the same names) trains
    with the registered loss `loss_name` and its `options` (by option name); refused with PluginError when stock
    cannot feed it. Stock's names, torch's DDP class and the logging handlers stock's main adds are restored on exit."""
    plugin = LossPlugin.build(loss_name, dict(options or {}))

    def parse_args(argv):
        args = originals["parse_args"](argv)
        plugin.check_stock_args(args)
        return args

    replaced = {
        "parse_args": parse_args,
        "create_loss": plugin.create_loss,
        "train_one_epoch": plugin.train_one_epoch,
        "pt_load": plugin.pt_load,
    }
    originals = {name: getattr(module, name) for name in replaced}
    plugin.stock = originals
    handlers = list(logging.root.handlers)
    for name, function in replaced.items():
        setattr(module, name, function)
    try:
        with cpu_ddp():
            yield plugin
    finally:
        for name, function in originals.items():
            setattr(module, name, function)
        plugin.unhook()
        _remove_handlers_added_since(handlers)


def _remove_handlers_added_since(handlers: Sequence[logging.Handler]) -> None:
    """Stock's `setup_logging` adds a console and an out.log handler to the root logger at every call; a process that
    runs main again (tests, a notebook) would write the next run's lines into this run's out.log too."""
    for handler in list(logging.root.handlers):
        if handler not in handlers:
            logging.root.removeHandler(handler)
            handler.close()


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise PluginError(f"{message} ({PROG} --help lists the loss flags, then stock's)")


def loss_parser() -> argparse.ArgumentParser:
    """`--loss` and every loss option flag (stock's flags are left for stock's parser)."""
    parser = _OneLineParser(
        prog=PROG,
        add_help=False,
        allow_abbrev=False,  # an abbreviation of a stock flag must reach stock's parser
        description="Stock open_clip_train (OpenCLIP 3.3.0) with the project's losses: --loss NAME and its options; "
        "every other flag is open_clip_train's (listed below these).",
    )
    group = parser.add_argument_group("the project's losses")
    group.add_argument(
        "--loss",
        default=None,
        choices=accepted_loss_names(),
        help="the registered loss to train with (default: stock's own, ClipLoss or --siglip's SigLipLoss)",
    )
    for loss_flag in loss_flags().values():
        add_loss_flag(group, loss_flag)
    return parser


def split_argv(argv: Sequence[str]) -> Tuple[Optional[str], Dict[str, Any], List[str]]:
    """(the --loss, its options given, by option name; stock's arguments) from the command line."""
    argv = list(argv)
    if argv[:1] == ["--"]:  # torchrun ... -m open_clip_adacl.integrations.open_clip_train -- FLAGS
        argv = argv[1:]
    ours, stock_argv = loss_parser().parse_known_args(argv)
    values = vars(ours)
    if ours.loss is None:
        given = sorted(loss_flag.flag for loss_flag in loss_flags().values() if values.get(loss_flag.dest) is not None)
        if given:
            raise PluginError(f"{given[0]} is a loss option: give --loss too (python -m training.main --help)")
        return None, {}, stock_argv
    name = LOSSES.canonical(ours.loss)
    try:
        given = given_loss_options(name, values)
        return name, get_loss_class(name).Options.resolved_values(**given), stock_argv
    except ValueError as error:
        raise PluginError(loss_line(name, error)) from None


def main(argv: Optional[Sequence[str]] = None):
    """Stock's `open_clip_train.main.main` on `argv`, with `--loss NAME` and its options; returns what it returns."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        loss_parser().print_help()
        print("\nopen_clip_train's own flags:\n")
        return stock_main.parse_args(["--help"])  # prints and exits
    loss_name, options, stock_argv = split_argv(argv)
    if loss_name is None:
        with cpu_ddp():
            return stock_main.main(stock_argv)
    with patched_open_clip_train(loss_name, options):
        return stock_main.main(stock_argv)


def cli() -> None:
    try:
        status = main()
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if status in (None, 0) else 1)


if __name__ == "__main__":
    cli()
