"""Greedy accuracy of a policy directory on the held-out split of the arithmetic task.

Decodes the first ``--num-test`` test prompts of ``make_arithmetic_dataset(split="test")`` (of the ``--variant``'s
task: ``long`` is the long-chain variant, evaluated on the long-chain policy by default)
greedily (``--max-new-tokens``, left padding) and scores them with
``trl_groupopt.data.rewards.accuracy_reward`` (math-verify; the answer must be in ``\\boxed{}``) and
``format_reward``. Offline; one CPU thread.

    python scripts/eval_policy.py                                  # the shipped tiny policy
    python scripts/eval_policy.py --variant long --sampled-runs 4  # the long-chain policy on the long-chain task
    python scripts/eval_policy.py --policy out/echo-run --json eval.json --sampled-runs 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trl_groupopt.data.offline import (  # noqa: E402
    VARIANTS,
    greedy_accuracy,
    load_embedded_policy,
    make_arithmetic_dataset,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(VARIANTS), default="default", help="task variant of the test prompts")
    p.add_argument("--policy", help="model + tokenizer directory (default: the variant's shipped policy)")
    p.add_argument("--num-test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="seed of the test split")
    p.add_argument("--max-new-tokens", type=int, help="decoding length (default: the variant's)")
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument(
        "--sampled-runs",
        type=int,
        default=0,
        help="also measure accuracy when sampling at temperature 1 (GRPO's rollouts), averaged over this many seeded passes",
    )
    p.add_argument("--show", type=int, default=0, help="print this many completions")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args()
    variant = VARIANTS[args.variant]
    args.policy = args.policy or variant.policy
    args.max_new_tokens = args.max_new_tokens or variant.max_new_tokens

    t0 = time.time()
    model, tokenizer = load_embedded_policy(args.policy)
    ds = make_arithmetic_dataset(args.num_test, seed=args.seed, split="test", **variant.task)
    res = greedy_accuracy(
        model, tokenizer, ds, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, return_completions=True
    )
    completions = res.pop("completions")
    if args.sampled_runs > 0:
        runs = []
        for k in range(args.sampled_runs):
            torch.manual_seed(k)
            runs.append(
                greedy_accuracy(
                    model,
                    tokenizer,
                    ds,
                    max_new_tokens=args.max_new_tokens,
                    batch_size=args.batch_size,
                    do_sample=True,
                    temperature=1.0,
                )
            )
        res["sampled_accuracy"] = sum(r["accuracy"] for r in runs) / len(runs)
        res["sampled_format_rate"] = sum(r["format_rate"] for r in runs) / len(runs)
        res["sampled_runs"] = args.sampled_runs
    res.update(
        policy=str(args.policy),
        variant=args.variant,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        num_parameters=sum(p.numel() for p in model.parameters()),
        seconds=round(time.time() - t0, 2),
    )
    for prompt, sol, comp in list(zip(ds["prompt"], ds["solution"], completions))[: args.show]:
        print(f"{prompt[-1]['content']!r} gold {sol} -> {comp!r}")
    n_right = round(res["accuracy"] * res["num_scored"])
    print(
        f"greedy accuracy {res['accuracy']:.3f} ({n_right}/{res['num_scored']}), "
        f"format rate {res['format_rate']:.3f}, split test seed {args.seed}, "
        f"max_new_tokens {args.max_new_tokens}, {res['seconds']:.1f}s, policy {args.policy}"
    )
    if args.sampled_runs > 0:
        print(
            f"sampled (temperature 1, {args.sampled_runs} passes, seeds 0..{args.sampled_runs - 1}): "
            f"accuracy {res['sampled_accuracy']:.3f}, format rate {res['sampled_format_rate']:.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
