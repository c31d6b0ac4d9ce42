"""The user-facing layer: generation is TRL's, vLLM flags reach TRL, LoRA trains adapters only.

1. Generation untouched: no trainer of ours defines any of TRL's generation / vLLM weight-sync methods, and the one
   generation-path method the base overrides (`_generate_and_score_completions`) delegates to TRL's.
2. vLLM plumbing on CPU (vLLM cannot be installed here), see `test_vllm_colocate_through_trl_backend`'s docstring for
   exactly what is and is not covered.
3. LoRA: two training steps per method with a peft `LoraConfig` move only `lora_` weights.
(The model card's tests live in `tests/hub/test_model_card.py`, the push tests in `tests/hub/test_push.py`.)
"""

from __future__ import annotations

import importlib
import inspect
import io
import sys
import tokenize
import types
import zlib
from pathlib import Path

import pytest
import torch
from trl import GRPOTrainer

from tests.helpers import (
    clone_model,
    cpu_config_kwargs,
    length_reward,
    method_trainer,
    tiny_dataset,
    tiny_model,
)
from tests.selection import tested_methods
from trl_groupopt import METHODS, DFPOConfig, DFPOTrainer, ECHOConfig, ECHOTrainer, GroupOptTrainer, get_method
from trl_groupopt.cli.main import parse
from trl_groupopt.trainer.boundary import TRLHooks

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "trl_groupopt"
OUR_TRAINERS = sorted({spec.trainer_class for spec in METHODS.values()}, key=lambda c: c.__name__)


# ======================================================================================== 1. generation untouched
#: TRL's generation / vLLM weight-sync entry points. The first two are the names older TRL used on the trainer
#: itself (TRL 1.16 moved weight sync into `trl.generation.vllm_generation.VLLMGeneration.sync_weights`); the
#: others are the rest of TRL 1.16's generation path on `GRPOTrainer` (tool loop and prompt tokenisation).
EXPLICIT_GENERATION_METHODS = {
    "_move_model_to_vllm",
    "_sync_fsdp_params_to_vllm",
    "_generate",
    "_generate_single_turn",
    "_tool_call_loop",
    "_get_tool_suffix_ids",
    "_tokenize_prompts",
}
#: The generation-path method the base does override, only to add `group_ids` / `rewards` after TRL's.
DELEGATING_METHOD = "_generate_and_score_completions"


def _trl_generation_methods() -> set[str]:
    """Every method of TRL's GRPOTrainer whose name mentions vllm or generat(e|ion), except the delegating one."""
    names = {
        name
        for name in dir(GRPOTrainer)
        if ("vllm" in name.lower() or "generat" in name.lower()) and callable(getattr(GRPOTrainer, name))
    }
    return (names - {DELEGATING_METHOD}) | EXPLICIT_GENERATION_METHODS


def _our_classes(trainer_cls: type) -> list[type]:
    return [klass for klass in trainer_cls.__mro__ if klass.__module__.split(".")[0] == "trl_groupopt"]


def test_trl_generation_method_names_are_real():
    """Guard against a vacuous check: the names we forbid are TRL 1.16's actual generation methods."""
    names = _trl_generation_methods()
    assert {"_generate", "_generate_single_turn", "_tool_call_loop"} <= {n for n in names if hasattr(GRPOTrainer, n)}
    assert hasattr(GRPOTrainer, DELEGATING_METHOD)


@pytest.mark.parametrize("trainer_cls", OUR_TRAINERS, ids=lambda c: c.__name__)
def test_no_trainer_overrides_generation(trainer_cls):
    """None of our classes in the MRO defines a generation / weight-sync method: TRL's are the ones resolved."""
    forbidden = _trl_generation_methods()
    classes = _our_classes(trainer_cls)
    assert trainer_cls in classes and GroupOptTrainer in classes
    for klass in classes:
        overridden = sorted(forbidden & set(vars(klass)))
        assert not overridden, f"{klass.__qualname__} overrides TRL's generation path: {overridden}"
        vllm_attrs = sorted(name for name in vars(klass) if "vllm" in name.lower())
        assert not vllm_attrs, f"{klass.__qualname__} defines vLLM attributes: {vllm_attrs}"
    for name in forbidden:
        if hasattr(GRPOTrainer, name):
            assert inspect.getattr_static(trainer_cls, name) is inspect.getattr_static(GRPOTrainer, name), name


@pytest.mark.parametrize("trainer_cls", OUR_TRAINERS, ids=lambda c: c.__name__)
def test_generate_and_score_delegates_to_trl(trainer_cls):
    """Each of our overrides of `_generate_and_score_completions` calls the parent's (ultimately TRL's)."""
    definers = [klass for klass in _our_classes(trainer_cls) if DELEGATING_METHOD in vars(klass)]
    assert TRLHooks in definers  # the base adds group_ids / rewards
    for klass in definers:
        source = inspect.getsource(vars(klass)[DELEGATING_METHOD])
        assert f"super().{DELEGATING_METHOD}(" in source, (
            f"{klass.__qualname__} does not call TRL's {DELEGATING_METHOD}"
        )


def test_package_code_never_touches_the_vllm_backend():
    """No code of trl_groupopt (names, not comments or docstrings) reaches into TRL's vLLM backend."""
    forbidden = {"VLLMGeneration", "vllm_generation", "VLLMClient", "vllm_client", "sync_weights", "load_weights",
                 "_move_model_to_vllm", "_sync_fsdp_params_to_vllm"}  # fmt: skip
    found = []
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    assert len(files) > 5
    for path in files:
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        found += [f"{path.name}:{tok.start[0]} {tok.string}" for tok in tokens
                  if tok.type == tokenize.NAME and tok.string in forbidden]  # fmt: skip
    assert not found, found


# ============================================================================================= 2. vLLM plumbing
COLOCATE_ARGV = [
    "--use_vllm", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.3",
    "--vllm_importance_sampling_correction", "true",
]  # fmt: skip
# The same flags with values that differ from TRL's defaults, so a dropped flag cannot pass by coincidence.
COLOCATE_ARGV_NONDEFAULT = [
    "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.55",
    "--vllm_importance_sampling_correction", "false", "--vllm_tensor_parallel_size", "2",
    "--vllm_max_model_length", "1024", "--vllm_enable_sleep_mode", "true", "--vllm_model_impl", "transformers",
    "--vllm_importance_sampling_mode", "token_truncate", "--vllm_importance_sampling_clip_max", "2.5",
]  # fmt: skip
SERVER_ARGV = [
    "--use_vllm", "--vllm_mode", "server", "--vllm_server_host", "10.1.2.3", "--vllm_server_port", "8123",
    "--vllm_group_port", "51299", "--vllm_server_timeout", "30",
]  # fmt: skip
SERVER_URL_ARGV = ["--use_vllm", "--vllm_mode", "server", "--vllm_server_base_url", "http://vllm.internal:9000"]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_cli_vllm_flags_reach_the_config(method):
    """`trl_groupopt.cli.main.parse` (behind examples/train_<method>.py) turns TRL's vLLM flags into the method's config."""
    config_cls = METHODS[method].config_class

    _, args, _, _ = parse(method, COLOCATE_ARGV)
    assert type(args) is config_cls
    assert (args.use_vllm, args.vllm_mode) == (True, "colocate")
    assert args.vllm_gpu_memory_utilization == pytest.approx(0.3)
    assert args.vllm_importance_sampling_correction is True

    _, args, _, _ = parse(method, COLOCATE_ARGV_NONDEFAULT)
    assert (args.use_vllm, args.vllm_mode) == (True, "colocate")
    assert args.vllm_gpu_memory_utilization == pytest.approx(0.55)
    assert args.vllm_importance_sampling_correction is False
    assert (args.vllm_tensor_parallel_size, args.vllm_max_model_length) == (2, 1024)
    assert (args.vllm_enable_sleep_mode, args.vllm_model_impl) == (True, "transformers")
    assert args.vllm_importance_sampling_mode == "token_truncate"
    assert args.vllm_importance_sampling_clip_max == pytest.approx(2.5)

    _, args, _, _ = parse(method, SERVER_ARGV)
    assert (args.use_vllm, args.vllm_mode) == (True, "server")
    assert (args.vllm_server_host, args.vllm_server_port, args.vllm_group_port) == ("10.1.2.3", 8123, 51299)
    assert args.vllm_server_timeout == pytest.approx(30.0)

    _, args, _, _ = parse(method, SERVER_URL_ARGV)
    assert (args.vllm_mode, args.vllm_server_base_url) == ("server", "http://vllm.internal:9000")

    _, args, _, _ = parse(method, [])
    assert args.use_vllm is False  # and without the flags, no vLLM


# ---- a stand-in vLLM: the real `vllm` package cannot be installed on this CPU machine
class _Logprob:
    def __init__(self, logprob: float):
        self.logprob, self.rank = logprob, 1


class _Engine:
    """What TRL's colocate weight sync reaches: `llm.llm_engine.model_executor.driver_worker.model_runner.model`."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.model_config = types.SimpleNamespace(max_model_len=model.config.max_position_embeddings)
        self.model_executor = types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=self))
        )
        self.loaded: list[str] = []

    def load_weights(self, weights):
        params = dict(self.model.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)
            self.loaded.append(name)


@torch.no_grad()
def _sample(model, prompt_ids: list[int], max_tokens: int, temperature: float, eos_id: int, generator):
    """Ancestral sampling at `temperature`; returns the tokens and their processed (temperature-scaled) log-probs."""
    ids, tokens, logps = list(prompt_ids), [], []
    for _ in range(max_tokens):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float() / temperature  # (V,)
        log_probs = torch.log_softmax(logits, dim=-1)  # (V,)
        token = int(torch.multinomial(log_probs.exp(), 1, generator=generator))
        tokens.append(token)
        logps.append(float(log_probs[token]))
        ids.append(token)
        if token == eos_id:
            break
    return tokens, logps


class FakeVLLM:
    """Records what TRL passes to vLLM and samples with its own copy of the policy (weights only via TRL's sync)."""

    def __init__(self, engine_model, eos_id: int, logp_bias: float = 0.0):
        self.engine_model, self.eos_id, self.logp_bias = engine_model.eval(), eos_id, logp_bias
        self.llm_kwargs: list[dict] = []
        self.sampling_kwargs: list[dict] = []
        self.generate_calls = 0
        self.generator = torch.Generator().manual_seed(0)
        fake = self

        class LLM:
            def __init__(self, **kwargs):
                fake.llm_kwargs.append(kwargs)
                self.llm_engine = fake.engine = _Engine(fake.engine_model)
                self.resets = 0

            def generate(self, prompts, sampling_params, use_tqdm=False):
                fake.generate_calls += 1
                params = sampling_params.kwargs
                outputs = []
                for prompt in prompts:
                    tokens, logps = _sample(fake.engine_model, prompt["prompt_token_ids"], params["max_tokens"],
                                            params["temperature"], fake.eos_id, fake.generator)  # fmt: skip
                    completion = types.SimpleNamespace(
                        token_ids=tokens, logprobs=[{t: _Logprob(lp - fake.logp_bias)} for t, lp in zip(tokens, logps)]
                    )
                    outputs.append(
                        types.SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=[completion])
                    )
                return outputs

            def reset_prefix_cache(self):
                self.resets += 1

        class SamplingParams:
            def __init__(self, **kwargs):
                fake.sampling_kwargs.append(kwargs)
                self.kwargs = kwargs

        self.LLM, self.SamplingParams = LLM, SamplingParams

    def install(self, monkeypatch):
        """Inject `vllm` into sys.modules and the names TRL's vLLM backend imported when vLLM was importable."""
        vllm_generation = importlib.import_module("trl.generation.vllm_generation")
        import_utils = importlib.import_module("trl.import_utils")

        module = types.ModuleType("vllm")
        module.LLM, module.SamplingParams, module.__version__ = self.LLM, self.SamplingParams, "0.24.0"
        sampling_module = types.ModuleType("vllm.sampling_params")
        sampling_module.StructuredOutputsParams = lambda **kwargs: kwargs
        module.sampling_params = sampling_module
        monkeypatch.setitem(sys.modules, "vllm", module)
        monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling_module)
        # `from vllm import LLM, SamplingParams` ran (and was skipped) when TRL was imported: bind them now.
        monkeypatch.setattr(vllm_generation, "LLM", self.LLM, raising=False)
        monkeypatch.setattr(vllm_generation, "SamplingParams", self.SamplingParams, raising=False)
        monkeypatch.setattr(vllm_generation, "StructuredOutputsParams", sampling_module.StructuredOutputsParams,
                            raising=False)  # fmt: skip
        monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
        monkeypatch.setattr(import_utils, "is_vllm_available", lambda *a, **k: True)
        # Colocate init writes the torch.distributed rendezvous variables into os.environ: restore them afterwards.
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)


@pytest.mark.slow
@pytest.mark.parametrize("method", tested_methods())
def test_vllm_colocate_through_trl_backend(method, tokenizer, base_model, tmp_path, monkeypatch):
    """Each trainer with `use_vllm=True, vllm_mode="colocate"` trains 2 steps through TRL's real vLLM backend.

    Covered (on CPU, with a stand-in `vllm` module whose `LLM` samples with its own copy of the tiny policy):
    - TRL's `GRPOTrainer.__init__` builds its `VLLMGeneration` from our config unchanged: the `LLM(...)` kwargs carry
      `gpu_memory_utilization=0.3`, `tensor_parallel_size`, `max_model_len`, `max_num_seqs`, sleep mode,
      `model_impl`, TRL's `logprobs_mode="processed_logprobs"`, and `SamplingParams` carries `max_tokens`,
      `temperature`, `n=1`, `logprobs=0`.
    - TRL's own `_generate_single_turn` vLLM branch generates (the fake is called once per generation), and TRL's
      colocate `sync_weights` streams every policy parameter into the engine before each generation: the engine
      starts from different random weights, yet TRL's logged `sampling/sampling_logp_difference/max` is ~0 at both
      steps, i.e. vLLM sampled with the trainer's current weights after each optimizer step.
    - The vLLM importance-sampling correction reaches our `_compute_loss`: every micro-batch it sees carries
      `importance_sampling_ratio` (and `test_vllm_importance_sampling_settings_reach_trl` shows the IS mode and clip
      from our config shape that ratio).
    Not covered: real vLLM (CUDA kernels, its sampler, paged KV cache, its `load_weights` name mapping for real
    architectures), tensor parallelism > 1, sleep mode, server mode's HTTP/NCCL transport (see the server test),
    and numerical agreement between a real vLLM and the trainer (the fake uses the same fp32 PyTorch model).
    """
    fake = FakeVLLM(tiny_model(tokenizer, seed=123), tokenizer.eos_token_id)
    fake.install(monkeypatch)
    trainer = method_trainer(
        method, tmp_path, clone_model(base_model), tokenizer, num_examples=16, use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3, vllm_importance_sampling_correction=True, vllm_max_model_length=200,
        vllm_model_impl="transformers", steps_per_generation=1, num_generations=2,
    )  # fmt: skip
    args = trainer.args

    (llm_kwargs,) = fake.llm_kwargs
    assert llm_kwargs["gpu_memory_utilization"] == pytest.approx(0.3)
    assert llm_kwargs["tensor_parallel_size"] == 1
    assert llm_kwargs["max_model_len"] == 200
    assert llm_kwargs["max_num_seqs"] == args.per_device_train_batch_size * args.steps_per_generation
    assert llm_kwargs["enable_sleep_mode"] is False
    assert llm_kwargs["model_impl"] == "transformers"
    assert llm_kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm_kwargs["distributed_executor_backend"] == "external_launcher"

    seen_keys = []
    compute_loss = trainer._compute_loss

    def spy(model, inputs):
        seen_keys.append(set(inputs))
        return compute_loss(model, inputs)

    monkeypatch.setattr(trainer, "_compute_loss", spy)
    trainer.train()

    assert fake.generate_calls == 2  # one generation per step (steps_per_generation=1), all through the fake
    params = fake.sampling_kwargs[-1]
    assert (params["n"], params["logprobs"], params["max_tokens"]) == (1, 0, args.max_completion_length)
    assert params["temperature"] == pytest.approx(args.temperature)
    policy_names = {name for name, _ in trainer.model.named_parameters()}
    assert set(fake.engine.loaded) == policy_names and len(fake.engine.loaded) == 2 * len(policy_names)
    assert seen_keys and all("importance_sampling_ratio" in keys for keys in seen_keys)
    logged = [entry for entry in trainer.state.log_history if "sampling/sampling_logp_difference/max" in entry]
    assert len(logged) == 2
    for entry in logged:  # vLLM (the fake) sampled with the weights the trainer had at that step
        assert entry["sampling/sampling_logp_difference/max"] < 1e-4, entry
        assert entry["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert any(not torch.equal(p, fake.engine_model.get_parameter(n)) for n, p in trainer.model.named_parameters())


@pytest.mark.slow
def test_vllm_importance_sampling_settings_reach_trl(tokenizer, base_model, tmp_path, monkeypatch):
    """With the engine's log-probs biased by +0.5 per token, TRL's truncated IS ratio is min(e^0.5, clip_max=1.3)."""
    fake = FakeVLLM(tiny_model(tokenizer, seed=123), tokenizer.eos_token_id, logp_bias=0.5)
    fake.install(monkeypatch)
    args = ECHOConfig(**cpu_config_kwargs(
        tmp_path, use_vllm=True, vllm_mode="colocate", vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.3, max_steps=1,
        steps_per_generation=1,
    ))  # fmt: skip
    trainer = ECHOTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
                          processing_class=tokenizer)  # fmt: skip
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in e]
    assert entry["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.3, abs=1e-4)
    assert entry["sampling/sampling_logp_difference/mean"] == pytest.approx(0.5, abs=1e-4)


class FakeVLLMClient:
    """Stands in for TRL's `VLLMClient` (HTTP + NCCL to a `trl vllm-serve` process) and records the calls."""

    instances: list[FakeVLLMClient] = []

    def __init__(self, engine_model, eos_id, **kwargs):
        self.kwargs, self.engine_model, self.eos_id = kwargs, engine_model.eval(), eos_id
        self.calls: list[str] = []
        self.pushed: list[str] = []
        self.generator = torch.Generator().manual_seed(0)

    def init_communicator(self, device):
        self.calls.append("init_communicator")

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    def update_named_params(self, metadata, params):
        self.calls.append("update_named_params")
        state = dict(self.engine_model.named_parameters())
        for name, tensor in params:
            state[name].data.copy_(tensor)
            self.pushed.append(name)

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, n, max_tokens, temperature, logprobs, **kwargs):
        self.calls.append("generate")
        self.sampling = dict(n=n, max_tokens=max_tokens, temperature=temperature, logprobs=logprobs, **kwargs)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "logprob_token_ids": []}
        for prompt in prompts:
            out["prompt_ids"].append(prompt)
            for _ in range(n):
                tokens, logps = _sample(
                    self.engine_model, prompt, max_tokens, temperature, self.eos_id, self.generator
                )
                out["completion_ids"].append(tokens)
                out["logprobs"].append([[lp] for lp in logps])
                out["logprob_token_ids"].append([[t] for t in tokens])
        return out


@pytest.mark.slow
def test_vllm_server_mode_through_trl_backend(tokenizer, base_model, tmp_path, monkeypatch):
    """Server mode: TRL's `VLLMGeneration` connects with our config's host/port/group port/timeout and trains.

    Covered: the client is built from `vllm_server_host`/`vllm_server_port` (as `base_url`), `vllm_group_port`,
    `vllm_server_timeout`; TRL pushes every parameter (`update_named_params`) before generating, asks for
    `num_generations` completions per unique prompt, and the whole-groups trainer (DFPO) trains on them.
    Not covered: the HTTP server, NCCL weight broadcast, `trl vllm-serve` itself.
    """
    vllm_generation = importlib.import_module("trl.generation.vllm_generation")
    fake = FakeVLLM(tiny_model(tokenizer, seed=123), tokenizer.eos_token_id)
    fake.install(monkeypatch)
    clients = []

    def make_client(**kwargs):
        clients.append(FakeVLLMClient(tiny_model(tokenizer, seed=321), tokenizer.eos_token_id, **kwargs))
        return clients[-1]

    monkeypatch.setattr(vllm_generation, "VLLMClient", make_client)
    args = DFPOConfig(**cpu_config_kwargs(
        tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="10.1.2.3", vllm_server_port=8123,
        vllm_group_port=51299, vllm_server_timeout=30, max_steps=1, steps_per_generation=1, num_generations=2,
    ))  # fmt: skip
    trainer = DFPOTrainer(clone_model(base_model), length_reward, args=args, train_dataset=tiny_dataset(8),
                          processing_class=tokenizer)  # fmt: skip
    (client,) = clients
    assert client.kwargs == {"base_url": "http://10.1.2.3:8123", "group_port": 51299, "connection_timeout": 30}
    trainer.train()
    assert client.calls[:4] == ["init_communicator", "update_named_params", "reset_prefix_cache", "generate"]
    assert set(client.pushed) == {name for name, _ in trainer.model.named_parameters()}
    assert client.sampling["n"] == args.num_generations and client.sampling["max_tokens"] == args.max_completion_length
    assert not fake.llm_kwargs  # server mode builds no local LLM
    (entry,) = [e for e in trainer.state.log_history if "sampling/sampling_logp_difference/max" in e]
    assert entry["sampling/sampling_logp_difference/max"] < 1e-4


# ===================================================================================================== 3. LoRA
def text_hash_reward(completions, **kwargs) -> list[float]:
    """Deterministic, almost surely different for different texts: every group has a non-zero advantage."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [zlib.crc32(t.encode()) % 1000 / 1000 for t in texts]


@pytest.mark.slow
@pytest.mark.parametrize("method", tested_methods())
def test_lora_trains_only_the_adapter(method, tokenizer, base_model, tmp_path):
    """2 optimizer steps with `peft_config=LoraConfig(r=4, q_proj/v_proj)`: base weights bit-identical, adapters move.

    Off-policy schedule (steps_per_generation 2 > accumulation 1) so the clipping objectives act on real ratios.
    """
    from peft import LoraConfig, PeftModel

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = get_method(method).make_config(**cpu_config_kwargs(tmp_path, num_generations=2, steps_per_generation=2))
    trainer = get_method(method).trainer_class(
        clone_model(base_model), text_hash_reward, args=args, train_dataset=tiny_dataset(16),
        processing_class=tokenizer, peft_config=peft_config)  # fmt: skip
    assert isinstance(trainer.model, PeftModel)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable), sorted(trainable)
    assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable} == {"q_proj", "v_proj"}

    trainer.train()

    assert trainer.state.global_step == 2
    changed = {name for name, p in trainer.model.named_parameters() if not torch.equal(before[name], p)}
    assert changed, "no weight moved"
    assert all("lora_" in name for name in changed), sorted(changed - trainable)
    assert any("lora_A" in name for name in changed) and any("lora_B" in name for name in changed)
    # The frozen base layers (PEFT's `...q_proj.base_layer.weight`) still hold the original weights, bit for bit.
    original = base_model.state_dict()
    base = {name.replace(".base_layer", ""): tensor for name, tensor in trainer.model.get_base_model().state_dict().items()
            if "lora_" not in name}  # fmt: skip
    assert base.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(base[name], tensor), name
