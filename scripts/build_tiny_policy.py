"""Build the embedded tiny policies shipped in trl_groupopt/assets/tiny_policy and tiny_policy_long.

Builds the tokenizer in code (trl_groupopt.data.offline.build_tokenizer), SFT-pretrains a 1.06 M-parameter
LlamaForCausalLM (hidden 128, intermediate 512, 4 layers, 4 heads, tied embeddings, fp32) on the
synthetic arithmetic task with plain torch on ONE CPU thread, evaluates greedy accuracy on the
200 held-out test prompts every 100 steps (every 25 once it reaches 5%: accuracy can climb ~30
points in 100 steps), keeps every checkpoint
whose accuracy lies in [15%, 60%], stops once accuracy passes 25%, and takes the checkpoint
closest to 25%: a policy that is right sometimes, so group-relative RL has signal both ways.

About 40% of the SFT targets write the bare answer instead of \\boxed{answer}; the accuracy reward
scores those 0. A last unbox stage (10 steps on targets unboxed 55% of the time) leaves greedy decoding boxing
about half its answers: the format headroom the 80-step demo learns. The artifact is committed: the
training curve moves by hundreds of steps with small code changes and need not be bit-identical on other CPUs, so CI
never rebuilds it.

The long-chain policy (``--variant long``) continues the shipped policy (``--init-from``) on the long-chain variant of
the task (``trl_groupopt.data.offline.LONG_CHAIN``: 8-12 operations on operands 1..20, completions of 71-143 tokens), every
target boxed, so that the benchmarks' long-completion regime starts from a policy that writes the whole chain and is
right some of the time; its settings are in its asset card.

    python scripts/build_tiny_policy.py                       # writes trl_groupopt/assets/tiny_policy
    python scripts/build_tiny_policy.py --variant long        # writes trl_groupopt/assets/tiny_policy_long
    python scripts/build_tiny_policy.py --out outputs/policy --log-json outputs/build.json
    python scripts/eval_policy.py                             # re-measures the shipped artifact
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)  # 2 threads on a 2-core shared machine ran 50x slower

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trl_groupopt.data.offline import (  # noqa: E402
    CHAT_TEMPLATE,
    ROLE_TOKENS,
    VARIANTS,
    arithmetic_chain_of_thought,
    arithmetic_problems,
    build_tokenizer,
    greedy_accuracy,
    load_embedded_policy,
    make_arithmetic_dataset,
)


def save_tokenizer(tokenizer, path: str | os.PathLike) -> None:
    """Save ``tokenizer`` so it loads on transformers 5.x and 4.57: 5.x writes ``tokenizer_class:
    TokenizersBackend``, a ``backend`` key and ``extra_special_tokens`` as a list, none of which 4.57 reads; 4.57 would
    also return ``token_type_ids``, which GRPOTrainer passes on to ``generate()``."""
    path = Path(path)
    tokenizer.save_pretrained(str(path))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, dict):  # the 4.x meaning of the key (named specials): keep as is
        cfg["extra_special_tokens"] = extra
    cfg["additional_special_tokens"] = list(ROLE_TOKENS)
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    cfg["padding_side"] = "left"
    cfg["clean_up_tokenization_spaces"] = False
    specials = {name: getattr(tokenizer, name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    cfg.update(specials)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    # Both versions read chat_template.jinja; keep the template inline too for older readers.
    if not (path / "chat_template.jinja").exists():
        (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    # 4.x also reads special_tokens_map.json; keep it consistent with the config.
    special_map = {**specials, "additional_special_tokens": list(ROLE_TOKENS)}
    (path / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


# `--variant long` defaults (the long-chain policy's build, see its asset card): continue the shipped default policy
# on long chains, every target boxed (the long regime tests the chain, not the format), no unbox stage, and stop near
# 30% greedy accuracy.
LONG_BUILD_DEFAULTS = dict(
    init_from=VARIANTS["default"].policy,
    unboxed_fraction=0.0,
    unbox_steps=0,
    lr=1e-3,
    warmup_steps=20,
    steps=1500,
    eval_every=50,
    acc_min=0.12,
    acc_target=0.30,
    acc_stop=0.30,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(VARIANTS), default="default", help="task variant to train on")
    p.add_argument("--out", help="output directory (default: the variant's shipped asset folder)")
    p.add_argument(
        "--init-from", help="continue from this saved policy (its config and weights) instead of a fresh one"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=2000, help="length of the cosine schedule")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--unboxed-fraction", type=float, default=0.4)
    p.add_argument("--num-test", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, help="greedy evaluation length (default: the variant's)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-every-near", type=int, default=25, help="eval interval once accuracy >= --near")
    p.add_argument("--near", type=float, default=0.05, help="accuracy from which to evaluate more often")
    p.add_argument("--acc-min", type=float, default=0.15)
    p.add_argument("--acc-max", type=float, default=0.60)
    p.add_argument("--acc-target", type=float, default=0.25)
    p.add_argument("--acc-stop", type=float, default=0.25, help="stop once accuracy exceeds this")
    p.add_argument("--unbox-steps", type=int, default=10, help="steps of the unbox stage (0: none)")
    p.add_argument("--unbox-fraction", type=float, default=0.55, help="unboxed fraction of the unbox stage's targets")
    p.add_argument("--unbox-lr", type=float, default=1e-4)
    p.add_argument("--log-json", default=None, help="write the training/eval log here")
    p.add_argument("--candidates-dir", default=None, help="also write every kept checkpoint here, as step-<N>/")
    if p.parse_known_args()[0].variant == "long":
        p.set_defaults(**LONG_BUILD_DEFAULTS)
    args = p.parse_args()
    variant = VARIANTS[args.variant]
    args.task = dict(variant.task)
    args.out = args.out or variant.policy
    args.max_new_tokens = args.max_new_tokens or variant.max_new_tokens
    return args


def save_policy(model, tok, out: Path) -> None:
    """Write model, generation config and tokenizer to `out` (a clean folder, world-readable files)."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():  # a clean artifact: no stale shards or tokenizer files
        if f.is_file() and f.name != "README.md":
            f.unlink()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(str(out), safe_serialization=True)
    # transformers 4.x reads rope_theta / torch_dtype at the top level of config.json.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", "float32")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tok, out)
    for f in out.iterdir():  # safetensors writes 0600; package data must be world-readable
        if f.is_file():
            f.chmod(0o644)


def sft_step(model, opt, p_ids: list[list[int]], t_ids: list[list[int]], pad_id: int) -> torch.Tensor:
    """One AdamW step of cross-entropy on the completion tokens of (prompt, target) id pairs; returns the loss."""
    rows = [p + t for p, t in zip(p_ids, t_ids)]
    T = max(map(len, rows))
    input_ids = torch.full((len(rows), T), pad_id, dtype=torch.long)  # (B, T) right-padded
    attn = torch.zeros((len(rows), T), dtype=torch.long)  # (B, T)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)  # (B, T) completion tokens only
    for b, (r, p) in enumerate(zip(rows, p_ids)):
        input_ids[b, : len(r)] = torch.tensor(r)
        attn[b, : len(r)] = 1
        labels[b, len(p) : len(r)] = torch.tensor(r[len(p) :])
    loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def sft_texts(tok, exprs: list[str], boxed: list[bool]) -> tuple[list[str], list[str]]:
    """The chat prompts and the SFT targets (+ eos) for `exprs`, as text."""
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Compute {e}"}], tokenize=False, add_generation_prompt=True
        )
        for e in exprs
    ]
    targets = [arithmetic_chain_of_thought(e, boxed=b) + tok.eos_token for e, b in zip(exprs, boxed)]
    return prompts, targets


def sft_pairs(tok, exprs: list[str], boxed: list[bool]) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of the chat prompts and of the SFT targets (+ eos) for `exprs`."""
    prompts, targets = sft_texts(tok, exprs, boxed)
    return tok(prompts, add_special_tokens=False)["input_ids"], tok(targets, add_special_tokens=False)["input_ids"]


def unbox_stage(model, tok, args: argparse.Namespace) -> list[tuple[int, float]]:
    """Fine-tune the chosen checkpoint for ``--unbox-steps`` on targets that are boxed only half the time.

    The main SFT leaves greedy decoding boxing ~90% of answers, so RL on the accuracy reward has little to gain in a
    demo-length run. A few steps at ``--unbox-fraction`` ~0.55 make the box a per-prompt coin flip for greedy decoding
    (format ~50%) while keeping the arithmetic: RL then learns to box the answers it already gets right. Fresh problems
    (seed + 7), a fresh AdamW at a constant ``--unbox-lr``. Returns the losses."""
    exprs = arithmetic_problems(args.unbox_steps * args.batch_size, seed=args.seed + 7, split="train", **args.task)
    fmt_rng = random.Random(args.seed + 8)
    opt = torch.optim.AdamW(model.parameters(), lr=args.unbox_lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    losses = []
    for step in range(args.unbox_steps):
        batch = exprs[step * args.batch_size : (step + 1) * args.batch_size]
        p_ids, t_ids = sft_pairs(tok, batch, [fmt_rng.random() >= args.unbox_fraction for _ in batch])
        losses.append((step + 1, round(sft_step(model, opt, p_ids, t_ids, tok.pad_token_id).item(), 4)))
    model.eval()
    return losses


def build_model(args: argparse.Namespace, tok):
    """The policy to train: `--init-from`'s (its architecture and weights), or a fresh 1.06 M-parameter Llama."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if args.init_from:  # continue a saved policy: same architecture, its weights
        model = AutoModelForCausalLM.from_pretrained(args.init_from, local_files_only=True).float()
        if model.config.vocab_size != len(tok):
            raise SystemExit(f"{args.init_from} has vocabulary {model.config.vocab_size}, the tokenizer {len(tok)}")
        return model
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(config).float()


def sft_data(args: argparse.Namespace, tok, t0: float) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of the SFT prompts and targets: one fresh problem per example (no repeats), ~40% with a bare
    (unboxed) answer."""
    n_train = args.steps * args.batch_size
    exprs = arithmetic_problems(n_train, seed=args.seed, split="train", **args.task)
    fmt_rng = random.Random(args.seed + 1)
    boxed = [fmt_rng.random() >= args.unboxed_fraction for _ in exprs]
    prompts, targets = sft_texts(tok, exprs, boxed)
    # The template's prompt is a token prefix of the full conversation (checked on a sample),
    # so prompt and target can be tokenized separately and concatenated.
    for e, b, p, t in list(zip(exprs, boxed, prompts, targets))[:32]:
        full = tok.apply_chat_template(
            [
                {"role": "user", "content": f"Compute {e}"},
                {"role": "assistant", "content": arithmetic_chain_of_thought(e, boxed=b)},
            ],
            tokenize=False,
        )
        assert full == p + t, (full, p + t)
    p_ids = tok(prompts, add_special_tokens=False)["input_ids"]
    t_ids = tok(targets, add_special_tokens=False)["input_ids"]
    print(
        f"data: {n_train} problems, {sum(not b for b in boxed) / n_train:.1%} unboxed, "
        f"max completion {max(map(len, t_ids))} tokens ({time.time() - t0:.1f}s)",
        flush=True,
    )
    return p_ids, t_ids


def lr_at(args: argparse.Namespace, step: int) -> float:
    """Linear warmup, then cosine to 0 over ``--steps``."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    frac = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    return args.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))


def evaluate_step(model, tok, args, test_ds, done: int, loss: float, lr: float, t_train: float, log: dict) -> dict:
    """Greedy accuracy on the held-out prompts at step `done`, printed and logged."""
    res = greedy_accuracy(model, tok, test_ds, max_new_tokens=args.max_new_tokens)
    elapsed = time.time() - t_train
    print(
        f"step {done:5d}  loss {loss:.4f}  lr {lr:.2e}  "
        f"greedy acc {res['accuracy']:.3f}  format {res['format_rate']:.3f}  ({elapsed:.0f}s)",
        flush=True,
    )
    log["evals"].append({"step": done, "loss": loss, **res, "elapsed_s": elapsed})
    return res


def train_sft(model, tok, args, p_ids, t_ids, test_ds, log: dict) -> tuple[list[dict], int]:
    """SFT with evaluations; keeps every checkpoint whose accuracy lies in [--acc-min, --acc-max] and stops once one
    was kept and accuracy passes --acc-stop (or --acc-max). Returns (candidates, the step it stopped at)."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    candidates: list[dict] = []
    next_eval = args.eval_every
    model.train()
    t_train = time.time()
    for step in range(args.steps):
        lo = step * args.batch_size
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        loss = sft_step(
            model, opt, p_ids[lo : lo + args.batch_size], t_ids[lo : lo + args.batch_size], tok.pad_token_id
        )
        done = step + 1
        if done % 25 == 0:
            log["losses"].append((done, round(loss.item(), 4)))
        if done != next_eval:
            continue
        res = evaluate_step(model, tok, args, test_ds, done, loss.item(), lr_at(args, step), t_train, log)
        if args.acc_min <= res["accuracy"] <= args.acc_max:
            state = copy.deepcopy(model.state_dict())
            candidates.append({"step": done, "accuracy": res["accuracy"], "format_rate": res["format_rate"],
                               "state": state})  # fmt: skip
        if candidates and (res["accuracy"] > args.acc_stop or res["accuracy"] > args.acc_max):
            return candidates, done
        next_eval = done + (args.eval_every_near if res["accuracy"] >= args.near else args.eval_every)
    return candidates, args.steps


def save_outputs(model, tok, args, candidates: list[dict], test_ds) -> tuple[dict, int]:
    """Write the chosen policy (and, with --candidates-dir, every kept checkpoint), then re-measure it from disk with
    the function scripts/eval_policy.py uses. Returns (the reloaded accuracy, the artifact's size in bytes)."""
    out = Path(args.out)
    save_policy(model, tok, out)
    if args.candidates_dir:  # every kept checkpoint, to compare their RL headroom before choosing
        chosen_state = copy.deepcopy(model.state_dict())
        for c in candidates:
            model.load_state_dict(c["state"])
            save_policy(model, tok, Path(args.candidates_dir) / f"step-{c['step']}")
        model.load_state_dict(chosen_state)
    model2, tok2 = load_embedded_policy(out)
    res = greedy_accuracy(model2, tok2, test_ds, max_new_tokens=args.max_new_tokens)
    return res, sum(f.stat().st_size for f in out.iterdir() if f.is_file())


def main() -> None:
    args = parse_args()
    t0 = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tok = build_tokenizer()
    model = build_model(args, tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params:,}  vocab: {len(tok)}", flush=True)
    p_ids, t_ids = sft_data(args, tok, t0)
    test_ds = make_arithmetic_dataset(args.num_test, seed=args.seed, split="test", **args.task)

    log: dict = {"args": vars(args), "params": n_params, "evals": [], "losses": []}
    t_train = time.time()
    candidates, stop_step = train_sft(model, tok, args, p_ids, t_ids, test_ds, log)
    train_s = time.time() - t_train
    if not candidates:
        raise SystemExit(f"no checkpoint reached greedy accuracy in [{args.acc_min}, {args.acc_max}]")
    best = min(candidates, key=lambda c: (abs(c["accuracy"] - args.acc_target), c["step"]))
    print(
        f"chosen step {best['step']} (greedy acc {best['accuracy']:.3f}, format {best['format_rate']:.3f}); "
        f"stopped at step {stop_step}",
        flush=True,
    )
    model.load_state_dict(best["state"])
    model.eval()
    if args.unbox_steps > 0:
        log["unbox_losses"] = unbox_stage(model, tok, args)
        res = greedy_accuracy(model, tok, test_ds, max_new_tokens=args.max_new_tokens)
        print(
            f"after {args.unbox_steps} steps at unboxed fraction {args.unbox_fraction}: "
            f"greedy acc {res['accuracy']:.3f}  format {res['format_rate']:.3f}",
            flush=True,
        )

    res, size = save_outputs(model, tok, args, candidates, test_ds)
    total_s = time.time() - t0
    print(
        f"reloaded: greedy acc {res['accuracy']:.3f} format {res['format_rate']:.3f}; "
        f"artifact {size / 1e6:.2f} MB; train {train_s:.0f}s, total {total_s:.0f}s",
        flush=True,
    )
    log.update({"chosen_step": best["step"], "chosen_accuracy": best["accuracy"], "stop_step": stop_step,
                "reloaded": res, "artifact_bytes": size, "train_s": train_s, "total_s": total_s,
                "torch": torch.__version__})  # fmt: skip
    if args.log_json:
        Path(args.log_json).write_text(json.dumps(log, indent=2) + "\n")


if __name__ == "__main__":
    main()
