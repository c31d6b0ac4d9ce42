"""The offline kit: tokenizer, synthetic task, adapters, rewards, and the embedded tiny policy.

Everything runs offline (tests/conftest.py applies tests/environment.py: HF_HUB_OFFLINE=1, one torch thread).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

from trl_groupopt.data.adapters import BOXED_SYSTEM_PROMPT, gsm8k_to_conversational, math_to_conversational
from trl_groupopt.data.offline import (
    EMBEDDED_LONG_POLICY_PATH,
    EMBEDDED_POLICY_PATH,
    LONG_CHAIN,
    LONG_CHAIN_MAX_COMPLETION_LENGTH,
    arithmetic_chain_of_thought,
    arithmetic_problems,
    build_tokenizer,
    greedy_accuracy,
    load_embedded_policy,
    make_arithmetic_dataset,
)
from trl_groupopt.data.rewards import accuracy_reward, extract_last_boxed, format_reward

GSM8K_ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
}
MATH_ROW = {
    "problem": "If $x = 2$ and $y = 4$, what is the value of $\\frac{x}{y}$?",
    "solution": "We have $\\frac{x}{y} = \\frac{2}{4} = \\boxed{\\frac{1}{2}}$.",
    "level": "Level 1",
    "type": "Algebra",
}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def policy():
    return load_embedded_policy()


def _messages(text: str, completion: str | None = None) -> list[dict[str, str]]:
    msgs = [{"role": "user", "content": text}]
    if completion is not None:
        msgs.append({"role": "assistant", "content": completion})
    return msgs


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_specials_and_padding(tok):
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4
    assert tok.padding_side == "left"
    assert 50 <= len(tok) <= 80
    batch = tok(["Compute 1+2", "Compute 11+22-33"], padding=True, add_special_tokens=False)
    assert set(batch.keys()) == {"input_ids", "attention_mask"}  # no token_type_ids for generate()
    assert batch["input_ids"][0][:5] == [tok.pad_token_id] * 5  # left padding (5 vs 10 tokens)
    assert batch["attention_mask"][0][:6] == [0, 0, 0, 0, 0, 1]


def test_tokenizer_round_trip_on_task_text(tok):
    texts = ["Compute 12+7-30", "12+7=19. 19-30=-11. \\boxed{-11}", "-5-50=-55. -55", BOXED_SYSTEM_PROMPT.lower()]
    for expr in arithmetic_problems(50, seed=3):
        texts += [f"Compute {expr}", arithmetic_chain_of_thought(expr), arithmetic_chain_of_thought(expr, False)]
    for s in texts:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids, s
        assert tok.decode(ids) == s
    # Multi-character words are single tokens; everything else is one token per character.
    assert tok.convert_ids_to_tokens(tok("Compute \\boxed{12}", add_special_tokens=False)["input_ids"]) == [
        "Compute",
        " ",
        "\\boxed{",
        "1",
        "2",
        "}",
    ]


def test_unknown_characters_map_to_unk(tok):
    s = GSM8K_ROW["question"] + " é€😀"
    ids = tok(s, add_special_tokens=False)["input_ids"]
    expected_unk = sum(1 for ch in s if ch.isupper() or ord(ch) > 127)  # "N", "A", "M", "H", é € 😀
    assert ids.count(tok.unk_token_id) == expected_unk
    assert len(ids) == len(s)  # one token per character, unknown ones included


def test_prompt_is_token_prefix_of_conversation(tok):
    for expr in arithmetic_problems(30, seed=5):
        for system in (None, "be brief."):
            msgs = ([{"role": "system", "content": system}] if system else []) + _messages(f"Compute {expr}")
            cot = arithmetic_chain_of_thought(expr)
            prompt_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
            full_ids = tok.apply_chat_template(
                msgs + [{"role": "assistant", "content": cot}], tokenize=True, return_dict=True
            )["input_ids"]
            assert full_ids[: len(prompt_ids)] == prompt_ids
            assert prompt_ids[0] == tok.bos_token_id and prompt_ids.count(tok.bos_token_id) == 1
            assert full_ids[-1] == tok.eos_token_id
            assert tok.decode(full_ids[len(prompt_ids) : -1]) == cot
    text = tok.apply_chat_template(_messages("Compute 1+2"), add_generation_prompt=True, tokenize=False)
    assert text == "<bos><|user|>Compute 1+2\n<|assistant|>"


# ----------------------------------------------------------------------------- synthetic task


def _test_bucket(expr: str) -> bool:  # independent restatement of the documented split rule
    return int(hashlib.sha256(expr.encode()).hexdigest()[:8], 16) % 1000 < 100


def test_dataset_columns_and_values():
    ds = make_arithmetic_dataset(300, seed=0, split="train")
    assert ds.column_names == ["prompt", "solution", "answer"]
    assert len(ds) == 300
    n_ops = set()
    for row in ds:
        assert len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user"
        content = row["prompt"][0]["content"]
        m = re.fullmatch(r"Compute (\d+)((?:[+-]\d+){2,3})", content)
        assert m, content
        expr = content[len("Compute ") :]
        operands = [int(x) for x in re.findall(r"\d+", expr)]
        assert all(1 <= x <= 50 for x in operands)
        n_ops.add(len(operands) - 1)
        assert row["answer"] == eval(expr)  # noqa: S307  (trusted, generated digits and +/-)
        assert row["solution"] == f"\\boxed{{{row['answer']}}}"
    assert n_ops == {2, 3}


def test_dataset_determinism_and_disjoint_splits():
    a = make_arithmetic_dataset(200, seed=0, split="test")
    b = make_arithmetic_dataset(200, seed=0, split="test")
    c = make_arithmetic_dataset(200, seed=1, split="test")
    assert a.to_list() == b.to_list()
    assert a.to_list() != c.to_list()
    train = set(arithmetic_problems(5000, seed=0, split="train")) | set(arithmetic_problems(2000, seed=1))
    test = set(arithmetic_problems(1000, seed=0, split="test")) | set(arithmetic_problems(500, seed=1, split="test"))
    assert len(set(arithmetic_problems(1000, seed=0, split="test"))) == 1000  # distinct within a split
    assert not train & test
    assert all(_test_bucket(e) for e in test) and not any(_test_bucket(e) for e in train)
    # A longer list starts with the shorter one (prefix-stable in num_examples).
    assert arithmetic_problems(50, seed=0, split="test") == arithmetic_problems(200, seed=0, split="test")[:50]
    with pytest.raises(ValueError):
        make_arithmetic_dataset(3, split="validation")


def test_default_variant_problems_are_unchanged():
    # The variant arguments must not move the default lists: the shipped policy, the demo and every committed
    # benchmark result were measured on them.
    assert arithmetic_problems(3) == ["38+24+16-46", "9-39-1-9", "28-9+1+44"]
    assert arithmetic_problems(3) == arithmetic_problems(3, operations=(2, 3), operands=(1, 50))


def test_long_chain_variant_has_long_reasoning_and_disjoint_splits(tok):
    train = make_arithmetic_dataset(300, seed=0, split="train", **LONG_CHAIN)
    test = make_arithmetic_dataset(100, seed=0, split="test", **LONG_CHAIN)
    exprs = [p[0]["content"][len("Compute ") :] for p in train["prompt"]]
    assert not set(exprs) & {p[0]["content"][len("Compute ") :] for p in test["prompt"]}
    assert not set(exprs) & set(arithmetic_problems(2000, seed=0))  # a different problem set from the default's
    lo_ops, hi_ops = LONG_CHAIN["operations"]
    assert {len(re.findall(r"\d+", e)) - 1 for e in exprs} == set(range(lo_ops, hi_ops + 1))
    assert all(1 <= int(x) <= LONG_CHAIN["operands"][1] for e in exprs for x in re.findall(r"\d+", e))
    assert train["answer"] == [eval(e) for e in exprs]  # noqa: S307
    targets = [arithmetic_chain_of_thought(e) + tok.eos_token for e in exprs]
    lengths = sorted(len(ids) for ids in tok(targets, add_special_tokens=False)["input_ids"])
    # completions of 100+ tokens, and max_completion_length never truncates a correct one
    assert lengths[len(lengths) // 2] >= 100 and lengths[-1] <= LONG_CHAIN_MAX_COMPLETION_LENGTH
    with pytest.raises(ValueError, match="operands"):
        arithmetic_problems(3, operands=(0, 20))


def test_chain_of_thought():
    assert arithmetic_chain_of_thought("12+7-30") == "12+7=19. 19-30=-11. \\boxed{-11}"
    assert arithmetic_chain_of_thought("12+7-30", boxed=False) == "12+7=19. 19-30=-11. -11"
    assert arithmetic_chain_of_thought("5-9-1+40") == "5-9=-4. -4-1=-5. -5+40=35. \\boxed{35}"
    for expr in arithmetic_problems(100, seed=9):
        cot = arithmetic_chain_of_thought(expr)
        assert cot.endswith(f"\\boxed{{{eval(expr)}}}")  # noqa: S307
        # every written step is true arithmetic
        for lhs, rhs in re.findall(r"(-?\d+[+-]\d+)=(-?\d+)\.", cot):
            assert eval(lhs) == int(rhs)  # noqa: S307
    with pytest.raises(ValueError):
        arithmetic_chain_of_thought("12*3")


# ----------------------------------------------------------------------------- rewards


def test_accuracy_reward_cases_and_formats():
    sols = ["\\boxed{-11}", "\\boxed{-11}", "\\boxed{-11}", "not a number", "42", "\\boxed{\\frac{1}{2}}"]
    texts = [
        "12+7=19. 19-30=-11. \\boxed{-11}",  # correct
        "12+7=19. 19-30=-12. \\boxed{-12}",  # wrong
        "12+7=19. 19-30=-11. -11",  # right number, no box: format matters
        "\\boxed{3}",  # gold unparseable -> None
        "so \\boxed{42}",  # plain gold answer
        "\\boxed{0.5}",  # math equivalence
    ]
    expected = [1.0, 0.0, 0.0, None, 1.0, 1.0]
    assert accuracy_reward(texts, solution=sols) == expected
    conversational = [[{"role": "assistant", "content": t}] for t in texts]
    assert accuracy_reward(conversational, solution=sols) == expected
    # Same numbers as TRL's own reward on conversational inputs.
    from trl.rewards import accuracy_reward as trl_accuracy_reward

    assert trl_accuracy_reward(conversational, sols) == expected
    logged = {}
    accuracy_reward(texts, sols, log_extra=lambda k, v: logged.__setitem__(k, v), prompts=None, trainer_state=None)
    assert set(logged) == {"solution", "gold_parsed", "answer_parsed"} and logged["gold_parsed"][3] == "[unparseable]"
    with pytest.raises(ValueError):
        accuracy_reward(texts, solution=sols[:2])


def test_format_reward_rule():
    cases = {
        "1+2=3. \\boxed{3}": 1.0,
        "1+2=3. \\boxed{3}.\n": 1.0,
        "$\\boxed{\\frac{1}{2}}$": 1.0,
        "1+2=3. 3": 0.0,  # no box
        "\\boxed{3} then more reasoning": 0.0,  # box not at the end
        "\\boxed{3} \\boxed{3}": 0.0,  # two boxes
        "\\boxed{3": 0.0,  # unclosed
        "\\boxed{ }": 0.0,  # empty
        "": 0.0,
    }
    texts = list(cases)
    assert format_reward(texts) == list(cases.values())
    assert format_reward([[{"role": "assistant", "content": t}] for t in texts]) == list(cases.values())


# ----------------------------------------------------------------------------- adapters


def test_gsm8k_adapter():
    row = gsm8k_to_conversational(GSM8K_ROW)
    assert row == {"prompt": [{"role": "user", "content": GSM8K_ROW["question"]}], "solution": "\\boxed{72}"}
    with_sys = gsm8k_to_conversational(GSM8K_ROW, system_prompt=BOXED_SYSTEM_PROMPT)
    assert with_sys["prompt"][0] == {"role": "system", "content": BOXED_SYSTEM_PROMPT}
    assert with_sys["prompt"][1]["role"] == "user"
    assert gsm8k_to_conversational({"question": "q", "answer": "x\n#### 1,000"})["solution"] == "\\boxed{1000}"
    assert gsm8k_to_conversational({"question": "q", "answer": "no marker"})["solution"] == ""
    assert accuracy_reward(["so \\boxed{72}", "\\boxed{71}"], [row["solution"]] * 2) == [1.0, 0.0]

    from datasets import Dataset

    mapped = Dataset.from_list([GSM8K_ROW, GSM8K_ROW]).map(
        gsm8k_to_conversational,
        fn_kwargs={"system_prompt": BOXED_SYSTEM_PROMPT},
        remove_columns=["question", "answer"],
    )
    assert mapped.column_names == ["prompt", "solution"] and mapped[1]["solution"] == "\\boxed{72}"


def test_math_adapter():
    row = math_to_conversational(MATH_ROW)
    assert row["solution"] == "\\boxed{\\frac{1}{2}}"  # nested braces kept
    assert row["prompt"] == [{"role": "user", "content": MATH_ROW["problem"]}]
    assert accuracy_reward(["\\boxed{\\frac{2}{4}}", "\\boxed{\\frac{1}{3}}"], [row["solution"]] * 2) == [1.0, 0.0]
    assert extract_last_boxed("a \\boxed{1} b \\boxed{x^{2}+1}.") == "x^{2}+1"
    assert extract_last_boxed("\\boxed 5$") == "5"
    assert extract_last_boxed("\\fbox{7}") == "7"
    assert extract_last_boxed("\\boxed{1") is None and extract_last_boxed("none") is None
    assert math_to_conversational({"problem": "p", "solution": "no box"})["solution"] == ""
    sys_row = math_to_conversational(MATH_ROW, system_prompt=BOXED_SYSTEM_PROMPT)
    assert [m["role"] for m in sys_row["prompt"]] == ["system", "user"]


# ----------------------------------------------------------------------------- embedded policy


@pytest.mark.parametrize("path", [EMBEDDED_POLICY_PATH, EMBEDDED_LONG_POLICY_PATH], ids=["default", "long"])
def test_artifact_files_and_size(path):
    root = Path(path)
    files = {f.name: f.stat().st_size for f in root.iterdir() if f.is_file()}
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "README.md",
    ):
        assert name in files, name
    assert sum(files.values()) <= 8 * 1024 * 1024
    cfg = json.loads((root / "tokenizer_config.json").read_text())
    # Loads on transformers 4.57 too: a plain PreTrainedTokenizerFast, no transformers-5-only `backend` key.
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in cfg
    assert cfg["model_input_names"] == ["input_ids", "attention_mask"]
    assert isinstance(cfg.get("additional_special_tokens"), list)
    assert not isinstance(cfg.get("extra_special_tokens", {}), list)
    gen = json.loads((root / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)


@pytest.mark.parametrize("path", [EMBEDDED_POLICY_PATH, EMBEDDED_LONG_POLICY_PATH], ids=["default", "long"])
def test_embedded_policy_loads_offline(path, tok):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    model, loaded = load_embedded_policy(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads) == (128, 512, 4, 4)
    assert c.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert c.vocab_size == len(loaded) == len(tok)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 1.0e6 <= sum(p.numel() for p in model.parameters()) <= 1.1e6
    # The saved tokenizer is the one built in code.
    assert loaded.get_vocab() == tok.get_vocab() and loaded.padding_side == "left"
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 0)
    msgs = _messages("Compute 3+4-5", "3+4=7. 7-5=2. \\boxed{2}")
    assert loaded.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
    assert loaded(["a", "Compute 1+1"], padding=True).keys() == {"input_ids", "attention_mask"}
    assert loaded.decode([1, 5, 8, 6, 2], skip_special_tokens=True) == "Compute"


def test_embedded_policy_greedy_sample(policy):
    model, tokenizer = policy
    ds = make_arithmetic_dataset(20, seed=0, split="test")
    res = greedy_accuracy(model, tokenizer, ds, max_new_tokens=48, return_completions=True)
    comps = res["completions"]
    # Greedy decoding follows the SFT format: steps "a+b=c." then a boxed or bare answer.
    step = re.compile(r"^(-?\d+[+-]\d+=-?\d+\. )+(\\boxed\{-?\d+\}|-?\d+)$")
    assert sum(bool(step.match(c)) for c in comps) >= 16, comps
    # Shipped policy: 5/20 right and 10/20 boxed on this sample (18% / 48% on all 200: greedy decoding
    # boxes about half its answers, the headroom the demo's RL learns); the bounds leave room for
    # argmax flips on other CPUs.
    assert 0.0 < res["accuracy"] < 1.0, comps
    assert 0.25 <= res["format_rate"] <= 0.75, comps


def test_long_policy_writes_the_whole_chain(tok):
    # The long-chain policy exists so the benchmarks' long regime has room: it must write every step of an 8-12
    # operation chain (completions of ~100 tokens, not the default policy's 2-3 steps) and be right some of the time.
    model, tokenizer = load_embedded_policy(EMBEDDED_LONG_POLICY_PATH)
    ds = make_arithmetic_dataset(20, seed=0, split="test", **LONG_CHAIN)
    res = greedy_accuracy(
        model, tokenizer, ds, max_new_tokens=LONG_CHAIN_MAX_COMPLETION_LENGTH, return_completions=True
    )
    comps = res["completions"]
    steps = [len(re.findall(r"-?\d+[+-]\d+=-?\d+\.", c)) for c in comps]
    n_ops = [len(re.findall(r"\d+", p[0]["content"])) - 1 for p in ds["prompt"]]
    assert sum(s == n for s, n in zip(steps, n_ops)) >= 16, list(zip(n_ops, comps))  # one step per operation
    lengths = [len(ids) for ids in tok(comps, add_special_tokens=False)["input_ids"]]
    assert sorted(lengths)[len(lengths) // 2] >= 80, lengths
    assert 0.0 < res["accuracy"] < 1.0 and res["format_rate"] >= 0.9, comps
