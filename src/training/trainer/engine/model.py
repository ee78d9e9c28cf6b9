"""The model and its tokenizer, built as OpenCLIP's trainer builds them, and the checks of --model and
--pretrained before any work.

The model comes from `open_clip.create_model_and_transforms` (our `adacl-tiny` config is registered by
importing `open_clip_adacl`). The optimizer is in `training.trainer.engine.optimizer`, the LR schedules in
`training.trainer.engine.schedule`, mixed precision in `training.trainer.engine.precision`.
"""

from __future__ import annotations

import copy
import difflib
import os
import pickle
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Union

import open_clip
import torch
from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME
from open_clip.factory import HF_HUB_PREFIX, LOCAL_DIR_PREFIX
from open_clip_train.params import ParseKwargs

import open_clip_adacl  # noqa: F401  (registers our model configs, e.g. adacl-tiny, with open_clip)

from ..flags import MODEL_SHAPE, ConfigError, HelpGroup, OneOrSeveral, flag
from ..run_folder.checkpoint_digest import CheckpointDamaged
from ..run_folder.checkpoint_files import first_line, load_checkpoint
from .precision import PRECISIONS

# Models whose config and weights come from outside the code: a folder (an export) or the Hugging Face hub.
SOURCED_MODEL_PREFIXES = (LOCAL_DIR_PREFIX, HF_HUB_PREFIX)


def _image_size(size: Union[None, int, List[int]]) -> Union[None, int, Tuple[int, int]]:
    """--force-image-size: one size (kept by OneOrSeveral as an int) or height and width."""
    if isinstance(size, list):
        if len(size) != 2:
            raise ConfigError(f"--force-image-size takes one size or height and width, got {size}")
        return tuple(size)
    return size


@dataclass(frozen=True)
class ModelConfig:
    """What decides the architecture, its initial weights and its preprocessing (OpenCLIP's flags)."""

    FLAG_GROUP: ClassVar[str] = HelpGroup.MODEL

    name: str = flag(
        "RN50",
        "Name of the model (open_clip.list_models()).",
        name="--model",
        field_default=MISSING,
        resume=MODEL_SHAPE,
    )
    pretrained: str = flag("", "Pretrained CLIP weights: a tag or a file path (e.g. an epoch_N.pt).")
    # The run's precision is resolved for its device (params.run_config); in code it defaults to fp32.
    precision: str = flag(
        None,
        "Floating point precision. Default: amp on CUDA (as OpenCLIP), fp32 on CPU "
        "(amp on CPU means fp16 autocast and amp_bf16 bf16 autocast, both slower there).",
        choices=PRECISIONS,
        group=HelpGroup.OPTIMISATION,
        field_default="fp32",
    )
    force_image_size: Optional[Union[int, Tuple[int, int]]] = flag(
        None, "Override default image size", type=int, action=OneOrSeveral, convert=_image_size, resume=MODEL_SHAPE
    )
    force_context_length: Optional[int] = flag(None, "Override default context length", resume=MODEL_SHAPE)
    force_quick_gelu: bool = flag(
        False, "Force use of QuickGELU activation for non-OpenAI transformer models.", resume=MODEL_SHAPE
    )
    force_custom_text: bool = flag(
        False, "Force use of CustomTextCLIP model (separate text-tower).", resume=MODEL_SHAPE
    )
    force_patch_dropout: Optional[float] = flag(None, "Override the patch dropout.")
    pretrained_image: bool = flag(False, "Load imagenet pretrained weights for image tower backbone if available.")
    image_mean: Optional[Tuple[float, ...]] = flag(
        None, "Override default image mean value of dataset", type=float, nargs="+", metavar="MEAN"
    )
    image_std: Optional[Tuple[float, ...]] = flag(
        None, "Override default image std deviation of dataset", type=float, nargs="+", metavar="STD"
    )
    image_interpolation: Optional[str] = flag(
        None, "Override default image resize interpolation", choices=["bicubic", "bilinear", "random"]
    )
    image_resize_mode: Optional[str] = flag(
        None, "Override default image resize (& crop) mode during inference", choices=["shortest", "longest", "squash"]
    )
    aug_cfg: Dict[str, Any] = flag(
        {},
        "Training augmentation overrides, key=value (open_clip AugmentationCfg).",
        nargs="*",
        action=ParseKwargs,
        convert=dict,
    )
    cache_dir: Optional[str] = flag(None, "Cache path for downloads.")
    lock_image: bool = flag(False, "Lock full image tower by disabling gradients.")
    lock_image_unlocked_groups: int = flag(0, "Leave last n image tower layer groups unlocked.")
    lock_image_freeze_bn_stats: bool = flag(
        False, "Freeze BatchNorm running stats in image tower for any locked layers."
    )
    lock_text: bool = flag(False, "Lock full text tower by disabling gradients.")
    lock_text_unlocked_layers: int = flag(0, "Leave last n text tower layer groups unlocked.")
    lock_text_freeze_layer_norm: bool = flag(
        False, "Freeze LayerNorm running stats in text tower for any locked layers."
    )
    lock_logit_scale: bool = flag(
        False,
        "(not in OpenCLIP) Keep logit_scale at its initial or pretrained value: "
        "separates a loss's effect on the temperature from its effect on the embeddings.",
    )
    grad_checkpointing: bool = flag(False, "Enable gradient checkpointing.")
    # Extra constructor kwargs, e.g. OpenCLIP's --siglip init (init_logit_scale, init_logit_bias).
    model_kwargs: Dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        if self.name.startswith(SOURCED_MODEL_PREFIXES):
            return
        known = open_clip.list_models()
        if self.name not in known:
            close = difflib.get_close_matches(self.name, known, n=5, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see open_clip.list_models()"
            raise ConfigError(f"--model {self.name!r} is not a known model config{hint}")
        if "multimodal_cfg" in (open_clip.get_model_config(self.name) or {}):
            raise ConfigError(
                f"--model {self.name} is a CoCa model; CoCa's captioning loss is not supported by open_clip_adacl"
            )


@dataclass
class ModelBundle:
    model: torch.nn.Module
    preprocess_train: Callable
    preprocess_val: Callable
    tokenizer: Callable


def architecture_kwargs(cfg: ModelConfig) -> Dict[str, Any]:
    """The keyword arguments of `open_clip.create_model` that shape the network (`open_clip_model_config`
    applies the same overrides to the config it exports)."""
    return dict(
        force_quick_gelu=cfg.force_quick_gelu,
        force_custom_text=cfg.force_custom_text,
        force_patch_dropout=cfg.force_patch_dropout,
        force_image_size=cfg.force_image_size,
        force_context_length=cfg.force_context_length,
        **cfg.model_kwargs,
    )


def parameter_count(cfg: ModelConfig) -> int:
    """The model's parameters, counted on the meta device: no weights allocated or downloaded (the dry run)."""
    model = open_clip.create_model(cfg.name, device="meta", **architecture_kwargs(cfg))
    return sum(parameter.numel() for parameter in model.parameters())


def load_problem(error: Exception) -> str:
    """The line of a model load's failure that says what is wrong: load_state_dict's first size mismatch or
    missing key (after its header line), a pickle refused in our words (`first_line`), else the first line."""
    if isinstance(error, pickle.UnpicklingError):
        return first_line(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    detail = next(
        (line for line in lines[1:] if line.startswith(("size mismatch", "Missing key", "Unexpected key"))),
        lines[0] if lines else type(error).__name__,
    )
    return f"{type(error).__name__}: {detail[:300]}"


def model_source_problem(name: str, error: Exception) -> str:
    """One line for a `local-dir:` or `hf-hub:` model that does not load, naming what to do about it."""
    if name.startswith(HF_HUB_PREFIX):
        return (
            f"--model {name}: cannot be fetched from the Hugging Face hub or its cache ({load_problem(error)}); "
            "connect to the network (or unset HF_HUB_OFFLINE) once to fill the cache, or pass a model folder as "
            f"--model {LOCAL_DIR_PREFIX}DIR"
        )
    return (
        f"--model {name}: the folder's model does not load ({load_problem(error)}); export it again with "
        "python -m training.export"
    )


def check_model_loads(cfg: ModelConfig) -> None:
    """A `local-dir:` or `hf-hub:` model is built once on the CPU (the dry run's check: its config and weights come
    from outside the code); a ConfigError in one line when it cannot be."""
    if not cfg.name.startswith(SOURCED_MODEL_PREFIXES):
        return
    try:
        open_clip.create_model(cfg.name, device="cpu", cache_dir=cfg.cache_dir, **architecture_kwargs(cfg))
    except Exception as error:  # noqa: BLE001 - the hub's, safetensors' and torch's errors, each its own type
        raise ConfigError(model_source_problem(cfg.name, error)) from None


def build_model(cfg: ModelConfig, device: torch.device) -> ModelBundle:
    """The CLIP model (dict output), its train/val transforms and tokenizer; towers locked as asked. A `local-dir:`
    or `hf-hub:` model that does not load is a ConfigError in one line (`model_source_problem`)."""
    try:
        model, preprocess_train, preprocess_val = open_clip.create_model_and_transforms(
            cfg.name,
            cfg.pretrained or None,
            precision=cfg.precision,
            device=device,
            image_mean=cfg.image_mean,
            image_std=cfg.image_std,
            image_interpolation=cfg.image_interpolation,
            image_resize_mode=cfg.image_resize_mode,
            aug_cfg=cfg.aug_cfg,
            pretrained_image=cfg.pretrained_image,
            output_dict=True,
            cache_dir=cfg.cache_dir,
            **architecture_kwargs(cfg),
        )
    except Exception as error:
        if not cfg.name.startswith(SOURCED_MODEL_PREFIXES):
            raise
        raise ConfigError(model_source_problem(cfg.name, error)) from None
    if cfg.lock_image:
        # LiT: https://arxiv.org/abs/2111.07991
        model.lock_image_tower(
            unlocked_groups=cfg.lock_image_unlocked_groups, freeze_bn_stats=cfg.lock_image_freeze_bn_stats
        )
    if cfg.lock_text:
        # OpenCLIP's built-in text tower cannot keep its LayerNorms trainable (lock_text_tower asserts
        # freeze_layer_norm, so OpenCLIP's own --lock-text crashes without --lock-text-freeze-layer-norm);
        # they are frozen with the other weights. Hugging Face towers (CustomTextCLIP) honour the flag.
        freeze_layer_norm = cfg.lock_text_freeze_layer_norm or not isinstance(model, open_clip.CustomTextCLIP)
        model.lock_text_tower(unlocked_layers=cfg.lock_text_unlocked_layers, freeze_layer_norm=freeze_layer_norm)
    if cfg.lock_logit_scale:
        model.logit_scale.requires_grad_(False)
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing()
    tokenizer = open_clip.get_tokenizer(cfg.name, context_length=cfg.force_context_length, cache_dir=cfg.cache_dir)
    return ModelBundle(model, preprocess_train, preprocess_val, tokenizer)


def check_pretrained(model_name: str, pretrained: str, cache_dir: Optional[str] = None) -> Optional[str]:
    """The file `--pretrained` loads from, checked before any work; ValueError saying what to change.

    A tag open_clip knows for `model_name` (e.g. openai) must be in the download cache or downloadable:
    it is fetched now, as `open_clip.create_model` would, and with HF_HUB_OFFLINE set an uncached tag
    fails at once instead of after the hub client's retries. A file must exist and read as a checkpoint
    or state dict (open_clip's `load_checkpoint` formats) whose content digest, when it carries one, matches.
    Returns None for no pretrained weights.
    """
    if not pretrained or model_name.startswith(SOURCED_MODEL_PREFIXES):
        return None
    tag_cfg = open_clip.get_pretrained_cfg(model_name, pretrained)
    if tag_cfg:
        return _fetch_pretrained_tag(model_name, pretrained, tag_cfg, cache_dir)
    if not os.path.exists(pretrained):
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        raise ValueError(
            f"no such file, and not a pretrained tag of {model_name} (its tags: "
            f"{', '.join(tags) or 'none'}); pass an existing checkpoint file or one of those tags"
        )
    try:
        if pretrained.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(pretrained, framework="pt") as f:
                state_dict = dict.fromkeys(f.keys())
        else:
            checkpoint = load_checkpoint(pretrained, mmap=True)
            state_dict = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    except CheckpointDamaged as error:
        raise ValueError(f"{error}; copy it again from where it was written, or pass another checkpoint") from None
    except Exception as error:  # any unreadable file gets the same advice
        raise ValueError(
            f"cannot be read as a checkpoint ({first_line(error)}); pass an epoch_N.pt, "
            f"an exported open_clip_model.safetensors or an open_clip state dict"
        ) from error
    if not isinstance(state_dict, dict) or not state_dict:
        raise ValueError("holds no state dict (expected a dict of tensors or a checkpoint with 'state_dict')")
    args = (
        checkpoint.get("args") if not pretrained.endswith(".safetensors") else None
    )  # the args training.main recorded
    recorded = args.get("model") if isinstance(args, dict) else None
    if isinstance(recorded, str) and recorded.replace("/", "-") != model_name.replace("/", "-"):
        raise ValueError(
            f"was trained as --model {recorded}, and --model is {model_name}: its weights do not fit that "
            f"architecture; pass --model {recorded}, or weights of {model_name}"
        )
    return pretrained


def _fetch_pretrained_tag(model_name: str, tag: str, tag_cfg: Dict[str, Any], cache_dir: Optional[str]) -> str:
    from huggingface_hub import constants, try_to_load_from_cache

    hub_path = tag_cfg.get("hf_hub", "")
    if hub_path and constants.HF_HUB_OFFLINE:
        repo_id, filename = os.path.split(hub_path)
        filename = filename or HF_WEIGHTS_NAME
        # The names open_clip's download_pretrained_from_hf tries: a .safetensors twin first.
        names = [
            HF_SAFE_WEIGHTS_NAME if filename == HF_WEIGHTS_NAME else os.path.splitext(filename)[0] + ".safetensors",
            filename,
        ]
        cached = [try_to_load_from_cache(repo_id, name, cache_dir=cache_dir) for name in names]
        found = [path for path in cached if isinstance(path, str)]
        if not found:
            raise ValueError(
                f"the weights of {model_name} {tag} (hf-hub {hub_path}) are not in the download "
                f"cache and HF_HUB_OFFLINE is set; download them once where the network is reachable "
                f"(same --cache-dir), or pass a checkpoint file"
            )
        return found[0]
    try:
        return open_clip.download_pretrained(tag_cfg, cache_dir=cache_dir)
    except Exception as error:  # network, cache and checksum failures alike
        raise ValueError(
            f"the weights of {model_name} {tag} are not in the download cache and could not be "
            f"downloaded ({type(error).__name__}: {str(error)[:200]}); download them once where the "
            f"network is reachable (same --cache-dir), or pass a checkpoint file"
        ) from error


def open_clip_model_config(cfg: ModelConfig) -> Dict[str, Any]:
    """The model config open_clip builds this model from, with our overrides applied.

    Mirrors the overrides `open_clip.create_model` applies to the named config, so that the config
    written by `training.export` rebuilds this exact architecture under stock open_clip.
    """
    model_cfg = copy.deepcopy(open_clip.get_model_config(cfg.name))
    if model_cfg is None:
        raise ValueError(f"no open_clip model config named {cfg.name!r}")
    if cfg.force_quick_gelu:
        model_cfg["quick_gelu"] = True
    if cfg.force_patch_dropout is not None:
        model_cfg["vision_cfg"]["patch_dropout"] = cfg.force_patch_dropout
    if cfg.force_image_size is not None:
        model_cfg["vision_cfg"]["image_size"] = cfg.force_image_size
    if cfg.force_context_length is not None:
        model_cfg["text_cfg"]["context_length"] = cfg.force_context_length
    if cfg.force_custom_text:
        model_cfg["custom_text"] = True
    model_cfg.update(cfg.model_kwargs)
    return model_cfg


def preprocess_config(model: torch.nn.Module) -> Dict[str, Any]:
    """The image preprocessing open_clip attached to the model (size, mean, std, interpolation...)."""
    return dict(open_clip.get_model_preprocess_cfg(model))
