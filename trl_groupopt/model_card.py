"""Hub model cards for trl-groupopt trainers, rendered on top of TRL's own card.

TRL's card (`trl.trainer.utils.generate_model_card` with `trl/templates/lm_model_card.md`, fed with the trainer's
`_name`, `_tag_names` and `_paper`, which `GroupOptTrainer` derives from the method's spec: the paper's title, arXiv
id and BibTeX are written once, in `trl_groupopt/methods/<method>.py`) provides the standard parts: the front matter
(`ModelCardData`), the tracking badges and the "trained with <method>, introduced in <paper>" line, the framework
versions, and the citations (the method's BibTeX and TRL's). The package template
`trl_groupopt/templates/model_card.md` lays them out and adds what a reader of an RL checkpoint needs to use and
reproduce it:

- an introduction and a quick start with no blank holes: the base model is a Hub link only when it is a Hub id (the
  embedded policy `trl_groupopt/assets/tiny_policy` is named as such; a local path never reaches the card), the dataset
  is a Hub link only when it is a Hub id, the question is one of the model's task (see `quick_start_question`), and
  an adapter is loaded on top of its base model;
- the method section: the advantage estimator the objective trained on (`advantage_estimator`, TRL's `"grpo"` for a
  config without it), every field of the method's config that `GRPOConfig` does not have (its knobs), then the
  GRPO/training settings that differ from what `GRPOConfig` would use by default;
- the results: the held-out accuracy before and after training when the run measured it
  (`trainer.heldout_accuracy`), the training reward as the mean of the first and of the last 10% of the logged steps
  (`trainer.state.log_history`; single logged points of a noisy curve would read as a trend), and the same for each
  reward function, and whether the method's mechanism acted (`trainer.mechanism_report`, `trl_groupopt.mechanism`);
- metadata: `library_name` `transformers` (`peft` for an adapter, as PEFT writes it), `pipeline_tag`, `license` when
  it is known (the embedded policy's, or the caller's `license=`; TRL's card writes a stray `licence: license`, which is
  dropped), and tags (TRL's, the method's, `peft`/the adapter type).

The quick start loads the model from where it lives: the Hub repo id when the run pushes (`push_to_hub`, or a
`hub_model_id` already set), else the absolute path of the folder the card is written in, so it runs from any folder.

Secrets never reach the card: fields whose name ends in `token` (e.g. `hub_token`) and other secret-like names are
skipped, string values are not read from the environment, and anything shaped like a Hugging Face token (`hf_...`) is
replaced by `<redacted>` in the rendered text.

`create_model_card(trainer, ...)` is the hook behind `GroupOptTrainer.create_model_card` (TRL's arguments) and
`GroupOptTrainer._save`; it writes `README.md` (by default in `trainer.args.output_dir`). `render_model_card(trainer,
...)` returns the markdown only.
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
from dataclasses import MISSING, fields
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from typing import Any

__all__ = ["SYNTHETIC_DATASET_NAME", "TEMPLATE_PATH", "create_model_card", "heldout_summary", "method_knobs",
           "quick_start_question", "render_model_card", "reward_summary"]  # fmt: skip

#: The package's card template (package data, see pyproject's `package-data`).
TEMPLATE_PATH = files("trl_groupopt") / "templates" / "model_card.md"
#: The name the demo script (`trl_groupopt/cli.py`) gives the offline synthetic arithmetic task; not a Hub dataset.
SYNTHETIC_DATASET_NAME = "synthetic-arithmetic"

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
    if isinstance(value, enum.Enum):  # lr_scheduler_type, optim (str enums: their value, not "SchedulerType.X")
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


#: GRPOConfig fields whose declared default (None) is replaced in `GRPOConfig.__post_init__` by a value derived from
#: other settings: the card compares against the derived value, so a setting the user never made is not listed.
DERIVED_DEFAULTS = {
    "steps_per_generation": lambda args: args.gradient_accumulation_steps,  # TRL: one generation per optimizer step
}


def method_knobs(args) -> list[dict[str, str | None]]:
    """Rows `{name, value, default}`: the method's own config fields (default None), then the reported GRPOConfig
    settings whose value differs from what `GRPOConfig` would use by default (its declared default, or the value its
    `__post_init__` derives, see `DERIVED_DEFAULTS`)."""
    from trl import GRPOConfig

    grpo_defaults = _declared_defaults(GRPOConfig)
    grpo_defaults.update({name: derive(args) for name, derive in DERIVED_DEFAULTS.items() if hasattr(args, name)})
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


#: The share of the logged steps each end of the reward summary averages (at least one logged step).
SUMMARY_FRACTION = 0.1


def _steps(points: list[tuple[Any, float]]) -> str:
    first, last = points[0][0], points[-1][0]
    return f"step {first}" if first == last else f"steps {first}-{last}"


def _curve(log_history: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The mean of `key` over the first and over the last `SUMMARY_FRACTION` of its logged steps, with their steps."""
    points = [(entry.get("step"), entry[key]) for entry in log_history
              if isinstance(entry.get(key), (int, float)) and not math.isnan(entry[key])]  # fmt: skip
    if not points:
        return None
    count = max(1, math.ceil(SUMMARY_FRACTION * len(points)))
    head, tail = points[:count], points[-count:]
    return {
        "name": key,
        "first": f"{sum(v for _, v in head) / count:.4g}", "first_steps": _steps(head),
        "last": f"{sum(v for _, v in tail) / count:.4g}", "last_steps": _steps(tail),
        "num_logged": len(points), "num_averaged": count,
    }  # fmt: skip


def reward_summary(log_history: list[dict[str, Any]], num_steps: int | None = None) -> dict[str, Any] | None:
    """The logged `reward` (TRL's weighted sum of the reward functions, mean over completions) and each
    `rewards/<function>/mean`: the mean over the first and over the last 10% of the logged steps (at least one), with
    those steps; None when no reward was logged."""
    total = _curve(log_history, "reward")
    if total is None:
        return None
    per_function = sorted({key for entry in log_history for key in entry
                           if key.startswith("rewards/") and key.endswith("/mean")})  # fmt: skip
    rows = [total] + [row for row in (_curve(log_history, key) for key in per_function) if row is not None]
    steps = [entry["step"] for entry in log_history if "step" in entry]
    return {"rows": rows, "num_logged": total["num_logged"], "num_averaged": total["num_averaged"],
            "num_steps": num_steps if num_steps is not None else (max(steps) if steps else 0)}  # fmt: skip


def heldout_summary(heldout: dict[str, Any] | None) -> dict[str, str] | None:
    """The card's held-out accuracy row from `trainer.heldout_accuracy` (`before`, `after`, `num_examples`); None
    when it was not measured."""
    if not heldout or heldout.get("after") is None:
        return None
    before = heldout.get("before")
    return {
        "before": "not measured" if before is None else f"{before:.1%}",
        "after": f"{heldout['after']:.1%}",
        "num_examples": str(heldout.get("num_examples", "?")),
        "metric": heldout.get("metric", "greedy-decoding accuracy"),
    }


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        if name == "trl-groupopt":
            from . import __version__

            return __version__
        return "unknown"


# ------------------------------------------------------------------------------------------------ base model, data
#: The quick start's question for the synthetic arithmetic task, in its prompt format (`trl_groupopt/offline/task.py`,
#: `make_arithmetic_dataset`: "Compute <expression>"), and the completion length the task needs.
ARITHMETIC_QUESTION = ("Compute 12+7-3", 48)
#: A GSM8K/MATH-style word problem for models trained on those datasets.
MATH_QUESTION = ("A baker puts 24 muffins into boxes of 4 and sells each box for $3. How much money does the baker "
                 "make by selling all the boxes?", 256)  # fmt: skip
#: TRL's own quick-start question (`trl/templates/lm_model_card.md`), for any other task.
GENERIC_QUESTION = ("If you had a time machine, but could only go to the past or the future once and never return, "
                    "which would you choose and why?", 128)  # fmt: skip


def _is_hub_id(name: str | None) -> bool:
    """Whether `name` can only be a Hub repo id: a valid id that is neither an absolute nor an existing local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or os.path.isabs(name) or os.path.exists(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


#: The license of the embedded tiny policy: trl-groupopt's own (pyproject.toml), as a Hub license id.
EMBEDDED_POLICY_LICENSE = "apache-2.0"


def _is_embedded_policy(name: str | None) -> bool:
    from .offline import EMBEDDED_POLICY_PATH

    return bool(name) and os.path.realpath(name) == os.path.realpath(EMBEDDED_POLICY_PATH)


def _base_model(model) -> dict[str, str | None]:
    """`hub_id` (the `base_model` metadata: a Hub id or None), the introduction's `text`, and how the quick start
    loads it under an adapter (`ref`, a Python expression, and `import`, a line before it)."""
    from trl.trainer.utils import get_config_model_id

    name = get_config_model_id(model.config)  # a PEFT model forwards `.config` to its base model
    if _is_hub_id(name):
        return {"hub_id": name, "text": f"[{name}](https://huggingface.co/{name})", "ref": repr(name), "import": None}
    if _is_embedded_policy(name):
        return {
            "hub_id": None,  # not on the Hub: no `base_model` metadata rather than a local path the Hub rejects
            "text": "trl-groupopt's embedded tiny policy (`trl_groupopt/assets/tiny_policy`, shipped with the package "
            "and loaded by `trl_groupopt.offline.load_embedded_policy()`; it is not on the Hub)",
            "ref": "EMBEDDED_POLICY_PATH",
            "import": "from trl_groupopt.offline import EMBEDDED_POLICY_PATH  # pip install trl-groupopt",
        }
    text = (
        "a local model (not on the Hub)" if name else "a model initialised from a configuration (no pretrained base)"
    )
    return {"hub_id": None, "text": text, "ref": '"path/to/base-model"',
            "import": "# The base model of this adapter is not on the Hub: point the path below at your copy of it."}  # fmt: skip


def _dataset(dataset_name: str | None) -> dict[str, str | None]:
    """`hub_id` (the `datasets` metadata) and the introduction's `text`: a link only for a Hub dataset id."""
    if not dataset_name:
        return {"hub_id": None, "text": None}
    if dataset_name == SYNTHETIC_DATASET_NAME:
        return {"hub_id": None, "text": "trl-groupopt's synthetic arithmetic task (generated offline by "
                "`trl_groupopt.offline.make_arithmetic_dataset`; not a Hub dataset)"}  # fmt: skip
    if "/" in dataset_name and _is_hub_id(dataset_name):
        return {"hub_id": dataset_name,
                "text": f"the [{dataset_name}](https://huggingface.co/datasets/{dataset_name}) dataset"}  # fmt: skip
    local_name = os.path.basename(os.path.normpath(dataset_name))  # never a machine path
    return {"hub_id": None, "text": f"the local dataset `{local_name}` (not on the Hub)"}


def quick_start_question(model, dataset_name: str | None) -> tuple[str, int]:
    """(question, max_new_tokens) for the quick start: a prompt of the model's task when the task is known (the
    synthetic arithmetic task, or the embedded policy with no dataset named; GSM8K/MATH-style data), else TRL's."""
    from trl.trainer.utils import get_config_model_id

    name = (dataset_name or "").lower()
    if dataset_name == SYNTHETIC_DATASET_NAME or (
        not dataset_name and _is_embedded_policy(get_config_model_id(model.config))
    ):
        return ARITHMETIC_QUESTION
    if "gsm8k" in name or "math" in name:
        return MATH_QUESTION
    return GENERIC_QUESTION


def _adapter(model) -> str | None:
    """ "LoraConfig, r=4" for a PEFT model, None otherwise."""
    from accelerate.utils import is_peft_model

    if not is_peft_model(model):
        return None
    peft_config = model.peft_config.get(model.active_adapter) if hasattr(model, "active_adapter") else None
    if peft_config is None:
        return "PEFT"
    return type(peft_config).__name__ + (f", r={peft_config.r}" if getattr(peft_config, "r", None) is not None else "")


def _tags(trainer, tags: str | list[str] | None) -> list[str]:
    """The card's tags, sorted. Mirrors the tag handling of TRL's `_BaseTrainer.create_model_card` (the caller's
    tags, `unsloth`, `hf_jobs`, the trainer's `_tag_names`, the Trackio tag), plus `peft` and the adapter type."""
    from trl.trainer.utils import get_trackio_space_url

    tag_set = {tags} if isinstance(tags, str) else set(tags or ())
    if hasattr(trainer.model.config, "unsloth_version"):
        tag_set.add("unsloth")
    if "JOB_ID" in os.environ:
        tag_set.add("hf_jobs")
    tag_set.update(trainer._tag_names)
    trackio_url = get_trackio_space_url()
    if trackio_url is not None:
        tag_set = {tag for tag in tag_set if not tag.startswith("trackio:")} | {f"trackio:{trackio_url}"}
    if _adapter(trainer.model) is not None:
        peft_type = getattr(trainer.model.peft_config.get(trainer.model.active_adapter), "peft_type", None)
        tag_set.update({"peft"} | ({str(getattr(peft_type, "value", peft_type)).lower()} if peft_type else set()))
    return sorted(tag_set)


# ------------------------------------------------------------------------------------------------ rendering
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$")
#: The sections of TRL's card the package template reuses, by heading.
TRL_SECTIONS = ("Training procedure", "Framework versions", "Citations")


def _sections(markdown: str) -> dict[str, str]:
    """Heading -> body (stripped, trailing spaces and runs of blank lines removed) of a markdown text."""
    out: dict[str, list[str]] = {}
    current, in_code = None, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else _HEADING.match(line)
        if match:
            current = match.group(1)
            out[current] = []
        elif current is not None:
            out[current].append(line.rstrip())
    return {name: re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() for name, lines in out.items()}


def _trl_card(trainer, model_name: str, hub_model_id: str, base_model: str | None, dataset: str | None, tags):
    """TRL's own card (`trl.trainer.utils.generate_model_card`, TRL's template), with the inputs TRL's
    `_BaseTrainer.create_model_card` gives it."""
    from transformers import is_wandb_available
    from trl.trainer.utils import generate_model_card, get_comet_experiment_url, get_trackio_space_url

    wandb_url = None
    if is_wandb_available():
        import wandb

        wandb_url = wandb.run.url if wandb.run is not None else None
    paper = getattr(trainer, "_paper", {}) or {}
    return generate_model_card(
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_model_id,
        dataset_name=dataset,
        tags=tags,
        wandb_url=wandb_url,
        trackio_url=get_trackio_space_url(),
        comet_url=get_comet_experiment_url(),
        trainer_name=trainer._name,
        trainer_citation=paper.get("citation"),
        paper_title=paper.get("title"),
        paper_id=paper.get("id"),
    )


def _estimator(args) -> dict[str, str]:
    """The advantage estimator the objective trained on: its name and one-line summary."""
    from .objectives.estimators import estimator_of

    estimator = estimator_of(args)
    return {"name": estimator.name, "summary": estimator.summary}


def _default_model_name(trainer) -> str:
    """TRL's choice in `GRPOTrainer._save_checkpoint` and transformers' in `Trainer.push_to_hub`."""
    hub_model_id = trainer.args.hub_model_id
    return hub_model_id.split("/")[-1] if hub_model_id else os.path.basename(os.path.normpath(trainer.args.output_dir))


def _model_location(trainer, output_dir: str | os.PathLike | None) -> str:
    """Where the quick start loads the model from: the Hub repo id when the run pushes (or already has a repo), else
    the absolute path of the card's folder (a relative path would work only from the folder the run started in)."""
    repo_id = trainer.hub_model_id or trainer.args.hub_model_id
    if repo_id and (trainer.args.push_to_hub or trainer.hub_model_id):
        return repo_id
    return os.path.abspath(os.fspath(output_dir if output_dir is not None else trainer.args.output_dir))


def _license(trainer, model, license: str | None) -> str | None:
    """The `license` metadata: the caller's, else the embedded policy's; None when unknown (a Hub base model's
    license is its own, read on the Hub, not here)."""
    from trl.trainer.utils import get_config_model_id

    if license:
        return license
    return EMBEDDED_POLICY_LICENSE if _is_embedded_policy(get_config_model_id(model.config)) else None


def render_model_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
    question: str | None = None,
    output_dir: str | os.PathLike | None = None,
    license: str | None = None,
) -> str:
    """The model card (markdown with YAML front matter) of a trained trl-groupopt trainer.

    Args:
        model_name: the card's title; default the Hub repo name (`hub_model_id`) or the output directory's name.
        dataset_name: the training data: a Hub dataset id (linked, and the `datasets` metadata), the demo's
            `SYNTHETIC_DATASET_NAME`, or any other name (mentioned without a link).
        tags: extra tags, added to TRL's and the method's.
        question: the quick start's prompt; default `quick_start_question(...)`.
        output_dir: the folder the card describes (default `trainer.args.output_dir`): the quick start loads it by
            absolute path unless the run pushes to the Hub.
        license: the `license` metadata (a Hub license id); default the embedded policy's, else none.
    """
    from huggingface_hub import ModelCard

    model = trainer.model
    model_name = model_name or _default_model_name(trainer)
    hub_model_id = trainer.hub_model_id or trainer.args.hub_model_id or model_name
    base, dataset, adapter = _base_model(model), _dataset(dataset_name), _adapter(model)
    trl_card = _trl_card(trainer, model_name, hub_model_id, base["hub_id"], dataset["hub_id"], _tags(trainer, tags))
    trl = _sections(trl_card.text)
    missing = [name for name in TRL_SECTIONS if not trl.get(name)]
    if missing:  # a TRL release changed its template: keep the card valid, without those parts
        import logging

        logging.getLogger(__name__).warning("TRL's model card has no %s section; the card leaves it out.", missing)
    card_data = trl_card.data
    card_data.pipeline_tag = "text-generation"
    card_data.__dict__.pop("licence", None)  # TRL's `licence="license"`: not a license, and a misspelt key
    card_data.license = _license(trainer, model, license)
    if adapter is not None:
        card_data.library_name = "peft"  # what PEFT itself writes for an adapter repo
    default_question, max_new_tokens = quick_start_question(model, dataset_name)
    doc = _DOC_LINK.sub(r"`\1`", (type(trainer).__doc__ or "").strip()).splitlines()  # "[`trl.X`]" -> "`trl.X`"
    card = ModelCard.from_template(
        card_data,
        template_str=TEMPLATE_PATH.read_text(encoding="utf-8"),
        model_name=model_name,
        model_location=_model_location(trainer, output_dir),
        base_text=base["text"],
        base_ref=base["ref"],
        base_import=base["import"],
        dataset_text=dataset["text"],
        trainer_name=trainer._name,
        trainer_class=type(trainer).__name__,
        trainer_description=doc[0] if doc else "",
        adapter=adapter,
        question=json.dumps(question or default_question, ensure_ascii=False),  # a Python string literal
        max_new_tokens=max_new_tokens,
        config_class=type(trainer.args).__name__,
        estimator=_estimator(trainer.args),
        knobs=method_knobs(trainer.args),
        rewards=reward_summary(trainer.state.log_history, trainer.state.global_step),
        heldout=heldout_summary(getattr(trainer, "heldout_accuracy", None)),
        mechanism=getattr(trainer, "mechanism_report", None),
        groupopt_version=_package_version("trl-groupopt"),
        peft_version=_package_version("peft") if adapter is not None else None,
        trl_training_procedure=trl.get("Training procedure", ""),
        trl_framework_versions=trl.get("Framework versions", ""),
        trl_citations=trl.get("Citations", ""),
    )
    return _redact(re.sub(r"\n{3,}", "\n\n", str(card)))


def create_model_card(
    trainer,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
    question: str | None = None,
    output_dir: str | os.PathLike | None = None,
    license: str | None = None,
) -> str | None:
    """Write the card to `<output_dir>/README.md` (default `trainer.args.output_dir`) on the main process; returns
    its path (None on other processes).

    The hook behind `GroupOptTrainer.create_model_card`, which TRL calls from `push_to_hub` and `_save_checkpoint`,
    and `GroupOptTrainer._save`, so every saved model folder (a LoRA adapter's too) holds this card rather than
    PEFT's empty template.
    """
    if not trainer.is_world_process_zero():
        return None
    output_dir = os.fspath(output_dir if output_dir is not None else trainer.args.output_dir)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "README.md")
    text = render_model_card(trainer, model_name=model_name, dataset_name=dataset_name, tags=tags, question=question,
                             output_dir=output_dir, license=license)  # fmt: skip
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
