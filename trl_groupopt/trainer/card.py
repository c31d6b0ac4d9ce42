"""Hub model cards: TRL's own card from "Training procedure" on, under our introduction and quick start, then the
method configuration and what was measured (`trl_groupopt/templates/model_card.md`; see docs/hub.md). A name the user
chose reaches the body only as a Python literal or code span; secret-named fields and `hf_...` tokens never do."""

from __future__ import annotations

import copy
import enum
import html
import json
import logging
import math
import os
import re
import tempfile
from dataclasses import MISSING, fields
from importlib.resources import files
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["EMBEDDED_POLICY_REFERENCE", "SYNTHETIC_DATASET_NAME", "TEMPLATE_PATH", "create_model_card",
           "heldout_summary", "method_knobs", "portable_adapter_config", "render_model_card",
           "reward_summary"]  # fmt: skip

TEMPLATE_PATH = files("trl_groupopt") / "templates" / "model_card.md"  # package data (pyproject's `package-data`)
SYNTHETIC_DATASET_NAME = "synthetic-arithmetic"  # the demo's offline task (`trl_groupopt/cli/main.py`); not on the Hub
#: The embedded policy as an adapter records its base (`portable_adapter_config`): the same in every installation.
EMBEDDED_POLICY_REFERENCE = "trl_groupopt/assets/tiny_policy"
EMBEDDED_POLICY_LICENSE = "apache-2.0"  # trl-groupopt's own (pyproject.toml), as a Hub license id
#: GRPOConfig fields listed when not at GRPOConfig's default: an allowlist, so hosts, paths and tokens never are.
REPORTED_GRPO_FIELDS = tuple("""learning_rate lr_scheduler_type warmup_ratio weight_decay max_grad_norm optim
    per_device_train_batch_size gradient_accumulation_steps num_train_epochs max_steps seed bf16 gradient_checkpointing
    use_liger_kernel disable_dropout cast_lm_head_to_fp32 num_generations max_completion_length steps_per_generation
    num_iterations temperature top_p top_k min_p repetition_penalty loss_type importance_sampling_level epsilon
    epsilon_high delta beta use_bias_correction_kl scale_rewards reward_weights multi_objective_aggregation
    mask_truncated_completions top_entropy_quantile entropy_coef use_adaptive_entropy off_policy_mask_threshold
    use_vllm vllm_mode vllm_importance_sampling_correction vllm_importance_sampling_mode
    vllm_importance_sampling_clip_min vllm_importance_sampling_clip_max""".split())  # fmt: skip
SUMMARY_FRACTION = 0.1  # the share of the logged steps each end of the reward summary averages (at least one)
#: Quick-start (question, max_new_tokens): the synthetic task's (`offline.py`), GSM8K/MATH-style, TRL's own.
ARITHMETIC_QUESTION = ("Compute 12+7-3", 48)
MATH_QUESTION = ("A baker puts 24 muffins into boxes of 4 and sells each box for $3. How much money does the baker "
                 "make by selling all the boxes?", 256)  # fmt: skip
GENERIC_QUESTION = ("If you had a time machine, but could only go to the past or the future once and never return, "
                    "which would you choose and why?", 128)  # fmt: skip
REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"(token|secret|password|api_key|credential)s?$", re.IGNORECASE)
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{16,}")  # Hugging Face user/org access tokens
#: Where TRL's card (`trl/templates/lm_model_card.md`) starts the part this card keeps.
TRL_KEPT_FROM = "\n## Training procedure"


def _code_span(text: Any) -> str:
    """`text` on one line as a markdown code span, shown verbatim whatever backticks or HTML it holds (CommonMark:
    a fence one backtick longer than any run inside; a space pads a leading or trailing backtick)."""
    text = " ".join(str(text).splitlines())
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _literal(text: str) -> str:
    """A double-quoted, one-line, ASCII Python string literal of `text` (JSON's escapes are Python's)."""
    return json.dumps(os.fspath(text))


def _redact(text: str) -> str:
    return _HF_TOKEN.sub(REDACTED, text)


def _format(value: Any) -> str:
    value = value.value if isinstance(value, enum.Enum) else value  # str enums by value, not "SchedulerType.X"
    return f"{value:.6g}" if isinstance(value, float) else str(value).replace("|", "\\|").replace("\n", " ")


def method_knobs(args) -> list[dict[str, str | None]]:
    """Rows `{name, value, default}`: the method's own config fields (default None), then the reported GRPOConfig
    settings whose value differs from what `GRPOConfig` would use (its declared or derived default)."""
    from trl import GRPOConfig

    defaults = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(GRPOConfig)}
    defaults["steps_per_generation"] = args.gradient_accumulation_steps  # `GRPOConfig.__post_init__` derives it
    rows: list[dict[str, str | None]] = [
        {"name": f.name, "value": _redact(_format(getattr(args, f.name))), "default": None}
        for f in fields(args)
        if f.name not in defaults and not _SECRET_NAME.search(f.name) and not f.name.startswith("_")
    ]
    for name in (name for name in REPORTED_GRPO_FIELDS if name in defaults and hasattr(args, name)):
        value, default = getattr(args, name), defaults[name]
        if getattr(value, "value", value) != getattr(default, "value", default):  # an enum equals its string
            rows.append({"name": name, "value": _redact(_format(value)), "default": _format(default)})
    return rows


def _curve(log_history: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The mean of `key` over the first and over the last `SUMMARY_FRACTION` of its logged steps, with their steps."""
    from .reporting import logged_points

    if not (points := logged_points(log_history, key)):
        return None
    count = max(1, math.ceil(SUMMARY_FRACTION * len(points)))
    row: dict[str, Any] = {"name": key, "num_logged": len(points), "num_averaged": count}
    for end, part in (("first", points[:count]), ("last", points[-count:])):
        row[end] = f"{sum(value for _, value in part) / count:.4g}"
        row[f"{end}_steps"] = f"step {part[0][0]}" if len(part) == 1 else f"steps {part[0][0]}-{part[-1][0]}"
    return row


def reward_summary(log_history: list[dict[str, Any]], num_steps: int | None = None) -> dict[str, Any] | None:
    """`_curve` rows of the logged `reward` (TRL's weighted sum of the reward functions) and of each
    `rewards/<function>/mean`; None when no reward was logged."""
    total = _curve(log_history, "reward")
    if total is None:
        return None
    names = sorted({key for entry in log_history for key in entry if re.fullmatch(r"rewards/.+/mean", key)})
    rows = [total] + [row for row in (_curve(log_history, name) for name in names) if row is not None]
    steps = [entry["step"] for entry in log_history if "step" in entry]
    return {"rows": rows, "num_logged": total["num_logged"], "num_averaged": total["num_averaged"],
            "num_steps": num_steps if num_steps is not None else max(steps, default=0)}  # fmt: skip


def heldout_summary(heldout: dict[str, Any] | None) -> dict[str, Any] | None:
    """`trainer.heldout_accuracy` (fractions `before`, `after`; `num_examples`, `metric`); None if not measured."""
    if not heldout or heldout.get("after") is None:
        return None
    return {"before": None, "num_examples": "?", "metric": "greedy-decoding accuracy", **heldout}


def _is_hub_id(name: str | None) -> bool:
    """Whether `name` can only be a Hub repo id: a valid id that is neither an absolute nor an existing local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        return bool(name) and not os.path.isabs(name) and not os.path.exists(name) and validate_repo_id(name) is None
    except HFValidationError:
        return False


def _question(dataset_name: str | None, base_kind: str) -> tuple[str, int]:
    """(question, max_new_tokens) of the synthetic task (or the embedded policy's), GSM8K/MATH-style data, or TRL's."""
    name = (dataset_name or "").lower()
    if name == SYNTHETIC_DATASET_NAME or base_kind == "embedded":  # the embedded policy answers only its own task
        return ARITHMETIC_QUESTION
    return MATH_QUESTION if "gsm8k" in name or "math" in name else GENERIC_QUESTION


def _adapter(model) -> tuple[str, str] | None:
    """The active PEFT adapter's words and tag, e.g. ("LoraConfig, r=4", "lora"); None for a model without one."""
    from accelerate.utils import is_peft_model

    if not is_peft_model(model):
        return None
    config = model.peft_config[model.active_adapter]
    words = type(config).__name__ + (f", r={config.r}" if getattr(config, "r", None) is not None else "")
    return words, str(getattr(config.peft_type, "value", config.peft_type)).lower()


def _trl_card(trainer, model_name: str, dataset_id: str | None, tags: list[str]):
    """TRL's own card, as a `ModelCard`: `GRPOTrainer.create_model_card` run as is on a shallow copy of the trainer
    whose `args.output_dir` (where TRL writes `README.md`) is a scratch folder, so that every rank may render."""
    from huggingface_hub import ModelCard
    from trl import GRPOTrainer

    view = copy.copy(trainer)
    with tempfile.TemporaryDirectory() as folder:
        view.args, view.is_world_process_zero = SimpleNamespace(output_dir=folder), lambda: True
        GRPOTrainer.create_model_card(view, model_name, dataset_id, tags)
        return ModelCard.load(os.path.join(folder, "README.md"))


def _model_location(trainer, output_dir: str | os.PathLike | None) -> str:
    """The Hub repo id when the run pushes (or has a repo), else the card's folder's absolute path (from anywhere)."""
    repo_id = trainer.hub_model_id or trainer.args.hub_model_id
    if repo_id and (trainer.args.push_to_hub or trainer.hub_model_id):
        return repo_id
    return os.path.abspath(os.fspath(output_dir if output_dir is not None else trainer.args.output_dir))


def render_model_card(trainer, model_name: str | None = None, dataset_name: str | None = None,
                      tags: str | list[str] | None = None, question: str | None = None,
                      output_dir: str | os.PathLike | None = None, license: str | None = None) -> str:  # fmt: skip
    """The card (markdown, YAML front matter). `model_name`: the title (default: the repo's or output folder's name);
    `dataset_name`: a Hub id, `SYNTHETIC_DATASET_NAME` or a local name; `output_dir`: the folder the card describes;
    `license`: default the embedded policy's, else none; `tags` add to TRL's; `question`: the quick start's."""
    from huggingface_hub import ModelCard
    from peft import __version__ as peft_version
    from trl.trainer.utils import get_config_model_id

    from .. import __version__
    from ..core.estimators import estimator_of
    from ..data.offline import uses_embedded_policy

    args, base, adapter = trainer.args, get_config_model_id(trainer.model.config), _adapter(trainer.model)
    base_id = base if _is_hub_id(base) else None  # a local path never reaches the card
    embedded = bool(base) and uses_embedded_policy(base)
    base_kind = "hub" if base_id else "embedded" if embedded else "local" if base else "config"
    dataset_id = dataset_name if dataset_name and "/" in dataset_name and _is_hub_id(dataset_name) else None
    model_name = model_name or (args.hub_model_id or os.path.normpath(args.output_dir)).split("/")[-1]
    user_tags = [tags] if isinstance(tags, str) else list(tags or [])
    trl = _trl_card(trainer, model_name, dataset_id, user_tags + (["peft", adapter[1]] if adapter else []))
    _, found, kept = trl.text.partition(TRL_KEPT_FROM)
    if not found:  # a TRL release changed its template: keep the card valid, without TRL's part
        logging.getLogger(__name__).warning("TRL's model card has no %r: the card leaves its part out.", TRL_KEPT_FROM)
    data = trl.data
    data.__dict__.pop("licence", None)  # TRL's `licence="license"`: not a license, and a misspelt key
    data.base_model, data.pipeline_tag, data.tags = base_id, "text-generation", sorted(set(data.tags or []))
    data.license = license or (EMBEDDED_POLICY_LICENSE if base_kind == "embedded" else None)
    data.library_name = "peft" if adapter else "transformers"  # what PEFT itself writes for an adapter repo
    default_question, max_new_tokens = _question(dataset_name, base_kind)
    doc = re.sub(r"\[`([^`]+)`\]", r"`\1`", (type(trainer).__doc__ or "").strip()).splitlines()  # "[`x`]" -> "`x`"
    card = ModelCard.from_template(
        data, template_str=TEMPLATE_PATH.read_text(encoding="utf-8"), code=_code_span, literal=_literal,
        title=html.escape(" ".join(model_name.split())), location=_literal(_model_location(trainer, output_dir)),
        base_id=base_id, base_kind=base_kind, embedded=EMBEDDED_POLICY_REFERENCE, dataset_id=dataset_id,
        dataset_name=dataset_name and os.path.basename(os.path.normpath(dataset_name)),  # never a machine path
        synthetic=dataset_name == SYNTHETIC_DATASET_NAME, trainer_name=trainer.display_name,
        trainer_class=type(trainer).__name__, description=doc[0] if doc else "", adapter=adapter and adapter[0],
        question=_literal(question or default_question), max_new_tokens=max_new_tokens,
        config_class=type(args).__name__, estimator=estimator_of(args), knobs=method_knobs(args),
        rewards=reward_summary(trainer.state.log_history, trainer.state.global_step),
        heldout=heldout_summary(getattr(trainer, "heldout_accuracy", None)), trl_part=found + kept,
        mechanism=getattr(trainer, "mechanism_report", None), groupopt_version=__version__,
        peft_version=adapter and peft_version,
    )  # fmt: skip
    text = re.sub(r"\n{3,}", "\n\n", re.sub(r"[ \t]+\n", "\n", str(card)))  # TRL's empty badge lines
    return _redact(text.rstrip("\n") + "\n")


def create_model_card(trainer, output_dir: str | os.PathLike | None = None, **card: Any) -> str | None:
    """On the main process: `render_model_card` written to `<output_dir or args.output_dir>/README.md`, its path."""
    if not trainer.is_world_process_zero():
        return None
    folder = Path(output_dir if output_dir is not None else trainer.args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(render_model_card(trainer, output_dir=folder, **card), encoding="utf-8")
    return str(folder / "README.md")


def portable_adapter_config(output_dir: str | os.PathLike) -> bool:
    """After an adapter save: `adapter_config.json` names the embedded policy as `EMBEDDED_POLICY_REFERENCE`, not by
    PEFT's absolute path, which breaks when the installation moves (docs/hub.md). Returns whether the file changed."""
    from ..data.offline import uses_embedded_policy

    path = Path(output_dir) / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    base = config.get("base_model_name_or_path")
    if not base or base == EMBEDDED_POLICY_REFERENCE or not uses_embedded_policy(base):
        return False
    path.write_text(json.dumps({**config, "base_model_name_or_path": EMBEDDED_POLICY_REFERENCE}, indent=2), "utf-8")
    return True
