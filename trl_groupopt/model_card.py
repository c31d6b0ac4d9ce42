"""Hub model cards for trl-groupopt trainers.

TRL's `create_model_card` renders `trl/templates/lm_model_card.md` from the trainer's `_name`, `_tag_names` and
`_paper`, and can only load templates from TRL's own package. Our card keeps everything TRL's has (front matter,
quick start, tracking badges, framework versions, the method's and TRL's BibTeX) and adds what a reader of an RL
checkpoint needs to reproduce it:

- the method (`trainer._name`, its paper) and its knobs: every field of the method's config that `GRPOConfig` does not
  have, plus the GRPO/training settings that differ from `GRPOConfig`'s defaults;
- a summary of the training reward curve from `trainer.state.log_history` (first, last and best logged `reward`, with
  their steps, and the same for each reward function).

Secrets never reach the card: fields whose name ends in `token` (e.g. `hub_token`) and other secret-like names are
skipped, string values are not read from the environment, and anything shaped like a Hugging Face token (`hf_...`) is
replaced by `<redacted>` in the rendered text.

`create_model_card(trainer, ...)` is the hook for `GroupOptTrainer.create_model_card` (same arguments as TRL's); it
writes `README.md` in `trainer.args.output_dir`. `render_model_card(trainer, ...)` returns the markdown only.
The template below is the canonical copy; `model_cards/template.md` in the repository is identical (a test checks).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import MISSING, fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["MODEL_CARD_TEMPLATE", "TRL_CITATION", "create_model_card", "method_knobs", "render_model_card",
           "reward_summary"]  # fmt: skip

#: BibTeX of TRL, as TRL's own card cites it.
TRL_CITATION = """@software{vonwerra2020trl,
  title   = {{TRL: Transformers Reinforcement Learning}},
  author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
  license = {Apache-2.0},
  url     = {https://github.com/huggingface/trl},
  year    = {2020}
}"""

#: GRPOConfig / TrainingArguments fields worth showing when they differ from GRPOConfig's defaults. An allowlist,
#: so infrastructure details (hosts, paths, hub ids, tokens) never reach the card.
REPORTED_GRPO_FIELDS = (
    # optimisation
    "learning_rate", "lr_scheduler_type", "warmup_ratio", "weight_decay", "max_grad_norm", "optim",
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs", "max_steps", "seed", "bf16",
    "gradient_checkpointing", "use_liger_kernel", "disable_dropout", "cast_lm_head_to_fp32",
    # generation
    "num_generations", "max_completion_length", "steps_per_generation", "num_iterations", "temperature", "top_p",
    "top_k", "min_p", "repetition_penalty",
    # objective and its shared extras
    "loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "beta", "use_bias_correction_kl",
    "scale_rewards", "reward_weights", "multi_objective_aggregation", "mask_truncated_completions",
    "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy", "off_policy_mask_threshold",
    # vLLM (generation backend and its importance-sampling correction)
    "use_vllm", "vllm_mode", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max",
)  # fmt: skip

_SECRET_NAME = re.compile(r"(token|secret|password|api_key|credential)s?$", re.IGNORECASE)
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{16,}")  # Hugging Face user/org access tokens
REDACTED = "<redacted>"
_DOC_LINK = re.compile(r"\[`([^`]+)`\]")

MODEL_CARD_TEMPLATE = """\
---
{{ card_data }}
---

# Model Card for {{ model_name }}

This model is a fine-tuned version of {% if base_model %}[{{ base_model }}](https://huggingface.co/{{ base_model }}){% else %}a local model{% endif %}{% if dataset_name %} on the [{{ dataset_name }}](https://huggingface.co/datasets/{{ dataset_name }}) dataset{% endif %}.
It has been trained with **{{ trainer_name }}** using [trl-groupopt](https://github.com/trl-groupopt/trl-groupopt) \
(`{{ trainer_class }}`, a drop-in subclass of TRL's `GRPOTrainer`) and [TRL](https://github.com/huggingface/trl).

## Quick start

```python
from transformers import pipeline

question = "If you had a time machine, but could only go to the past or the future once and never return, which would you choose and why?"
generator = pipeline("text-generation", model="{{ hub_model_id }}", device_map="auto")
output = generator([{"role": "user", "content": question}], max_new_tokens=128, return_full_text=False)[0]
print(output["generated_text"])
```

## Training procedure

{% if wandb_url %}[<img src="https://raw.githubusercontent.com/wandb/assets/main/wandb-github-badge-28.svg" alt="Visualize in Weights & Biases" width="150" height="24"/>]({{ wandb_url }}){% endif %}
{% if trackio_url %}[<img src="https://raw.githubusercontent.com/gradio-app/trackio/refs/heads/main/trackio/assets/badge.png" alt="Visualize in Trackio" title="Visualize in Trackio" width="150" height="24"/>]({{ trackio_url }}){% endif %}
{% if comet_url %}[<img src="https://raw.githubusercontent.com/comet-ml/comet-examples/master/logo/comet_badge.png" alt="Visualize in Comet" width="150" height="24"/>]({{ comet_url }}){% endif %}

This model was trained with {{ trainer_name }}{% if paper_id %}, a method introduced in [{{ paper_title }}](https://huggingface.co/papers/{{ paper_id }}){% endif %}.
{% if trainer_description %}
{{ trainer_description }}
{% endif %}{% if adapter %}
Only a PEFT adapter was trained (`{{ adapter }}`); the base model's weights are unchanged.
{% endif %}

### Method configuration

Settings of `{{ config_class }}` that `GRPOConfig` does not have, or whose value differs from `GRPOConfig`'s default:

| Setting | Value | GRPOConfig default |
|---|---|---|
{% for row in knobs %}| `{{ row.name }}` | `{{ row.value }}` | {% if row.default is none %}(method-specific){% else %}`{{ row.default }}`{% endif %} |
{% endfor %}
### Training reward

{% if rewards %}Optimizer steps: {{ rewards.num_steps }}; `reward` (mean over completions) logged at {{ rewards.num_logged }} of them.

| Metric | First (step) | Last (step) | Best (step) |
|---|---|---|---|
{% for row in rewards.rows %}| `{{ row.name }}` | {{ row.first }} ({{ row.first_step }}) | {{ row.last }} ({{ row.last_step }}) | {{ row.best }} ({{ row.best_step }}) |
{% endfor %}{% else %}No training reward was logged.
{% endif %}
### Framework versions

- trl-groupopt: {{ groupopt_version }}
- TRL: {{ trl_version }}
- Transformers: {{ transformers_version }}
- Pytorch: {{ pytorch_version }}
- Datasets: {{ datasets_version }}
- Tokenizers: {{ tokenizers_version }}

## Citations

{% if trainer_citation %}Cite {{ trainer_name }} as:

```bibtex
{{ trainer_citation }}
```
{% endif %}
Cite TRL as:

```bibtex
{{ trl_citation }}
```
"""


# ------------------------------------------------------------------------------------------------ the pieces
def _declared_defaults(config_cls) -> dict[str, Any]:
    """Field name -> the default a dataclass declares (before `__post_init__`); MISSING when it has none."""
    out = {}
    for f in fields(config_cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
        else:
            out[f.name] = MISSING
    return out


def _format(value: Any) -> str:
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):  # enums (lr_scheduler_type, optim)
        value = value.value
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return _redact(text)


def _redact(text: str) -> str:
    return _HF_TOKEN.sub(REDACTED, text)


def _same(a: Any, b: Any) -> bool:
    a, b = getattr(a, "value", a), getattr(b, "value", b)  # enum vs its string
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def method_knobs(args) -> list[dict[str, str | None]]:
    """Rows `{name, value, default}`: the method's own config fields (default None), then the reported GRPOConfig
    settings whose value differs from `GRPOConfig`'s declared default."""
    from trl import GRPOConfig

    grpo_defaults = _declared_defaults(GRPOConfig)
    rows = []
    for f in fields(args):
        if f.name in grpo_defaults or _SECRET_NAME.search(f.name) or f.name.startswith("_"):
            continue
        rows.append({"name": f.name, "value": _format(getattr(args, f.name)), "default": None})
    for name in REPORTED_GRPO_FIELDS:
        if name not in grpo_defaults or not hasattr(args, name):
            continue
        value, default = getattr(args, name), grpo_defaults[name]
        if default is MISSING or not _same(value, default):
            rows.append({"name": name, "value": _format(value),
                         "default": "(required)" if default is MISSING else _format(default)})  # fmt: skip
    return rows


def _curve(log_history: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    points = [(entry.get("step"), entry[key]) for entry in log_history
              if isinstance(entry.get(key), (int, float)) and not math.isnan(entry[key])]  # fmt: skip
    if not points:
        return None
    best_step, best = max(points, key=lambda p: p[1])
    return {
        "name": key,
        "first_step": points[0][0], "first": f"{points[0][1]:.4g}",
        "last_step": points[-1][0], "last": f"{points[-1][1]:.4g}",
        "best_step": best_step, "best": f"{best:.4g}",
        "num_logged": len(points),
    }  # fmt: skip


def reward_summary(log_history: list[dict[str, Any]], num_steps: int | None = None) -> dict[str, Any] | None:
    """First/last/best logged `reward` (TRL's weighted sum of the reward functions, mean over completions) and the
    same for each `rewards/<function>/mean`, with their steps; None when no reward was logged."""
    total = _curve(log_history, "reward")
    if total is None:
        return None
    per_function = sorted({key for entry in log_history for key in entry
                           if key.startswith("rewards/") and key.endswith("/mean")})  # fmt: skip
    rows = [total] + [row for row in (_curve(log_history, key) for key in per_function) if row is not None]
    steps = [entry["step"] for entry in log_history if "step" in entry]
    return {"rows": rows, "num_logged": total["num_logged"],
            "num_steps": num_steps if num_steps is not None else (max(steps) if steps else 0)}  # fmt: skip


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        if name == "trl-groupopt":
            from . import __version__

            return __version__
        return "unknown"


# ------------------------------------------------------------------------------------------------ rendering
def render_model_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
) -> str:
    """The model card (markdown with YAML front matter) of a trained trl-groupopt trainer."""
    from accelerate.utils import is_peft_model
    from huggingface_hub import ModelCard, ModelCardData
    from transformers import is_wandb_available
    from trl.trainer.utils import get_comet_experiment_url, get_config_model_id, get_trackio_space_url

    model = trainer.model
    model_id = get_config_model_id(model.config)
    base_model = model_id if model_id and not os.path.isdir(model_id) else None

    tag_set = {tags} if isinstance(tags, str) else set(tags or ())
    if hasattr(model.config, "unsloth_version"):
        tag_set.add("unsloth")
    if "JOB_ID" in os.environ:
        tag_set.add("hf_jobs")
    tag_set.update(getattr(trainer, "_tag_names", []))
    trackio_url = get_trackio_space_url()
    if trackio_url is not None:
        tag_set = {tag for tag in tag_set if not tag.startswith("trackio:")} | {f"trackio:{trackio_url}"}
    wandb_url = None
    if is_wandb_available():
        import wandb

        wandb_url = wandb.run.url if wandb.run is not None else None

    model_name = model_name or os.path.basename(os.path.normpath(trainer.args.output_dir))
    card_data = ModelCardData(
        base_model=base_model,
        datasets=dataset_name,
        library_name="transformers",
        licence="license",
        model_name=model_name,
        tags=["generated_from_trainer", *sorted(tag_set)],
    )
    paper = getattr(trainer, "_paper", {}) or {}
    doc = _DOC_LINK.sub(r"`\1`", (type(trainer).__doc__ or "").strip()).splitlines()  # "[`trl.X`]" -> "`trl.X`"
    adapter = None
    if is_peft_model(model):
        peft_config = model.peft_config.get(model.active_adapter) if hasattr(model, "active_adapter") else None
        adapter = type(peft_config).__name__ if peft_config is not None else "PEFT"
        if peft_config is not None and getattr(peft_config, "r", None) is not None:
            adapter += f", r={peft_config.r}"
    card = ModelCard.from_template(
        card_data,
        template_str=MODEL_CARD_TEMPLATE,
        model_name=model_name,
        base_model=base_model,
        hub_model_id=trainer.hub_model_id or model_name,
        dataset_name=dataset_name,
        wandb_url=wandb_url,
        trackio_url=trackio_url,
        comet_url=get_comet_experiment_url(),
        trainer_name=trainer._name,
        trainer_class=type(trainer).__name__,
        trainer_description=doc[0] if doc else "",
        trainer_citation=paper.get("citation"),
        paper_title=paper.get("title"),
        paper_id=paper.get("id"),
        config_class=type(trainer.args).__name__,
        knobs=method_knobs(trainer.args),
        rewards=reward_summary(trainer.state.log_history, trainer.state.global_step),
        adapter=adapter,
        trl_citation=TRL_CITATION,
        groupopt_version=_package_version("trl-groupopt"),
        trl_version=_package_version("trl"),
        transformers_version=_package_version("transformers"),
        pytorch_version=_package_version("torch"),
        datasets_version=_package_version("datasets"),
        tokenizers_version=_package_version("tokenizers"),
    )
    return _redact(re.sub(r"\n{3,}", "\n\n", str(card)))  # the empty badge lines


def create_model_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
) -> str | None:
    """Write the card to `<output_dir>/README.md` on the main process; returns its path (None elsewhere).

    The hook for `GroupOptTrainer.create_model_card`, which TRL calls from `push_to_hub` and `_save_checkpoint`.
    """
    if not trainer.is_world_process_zero():
        return None
    os.makedirs(trainer.args.output_dir, exist_ok=True)
    path = os.path.join(trainer.args.output_dir, "README.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_model_card(trainer, model_name=model_name, dataset_name=dataset_name, tags=tags))
    return path
