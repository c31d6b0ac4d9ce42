"""OTB's energy from TRL's fused LM head (`log_sum_sq_probs`) equals the energy from the full logits, and the fused
forward never builds a (B, T, V) tensor (the pure energy functions: tests/objectives/test_otb.py)."""

from __future__ import annotations

import pytest
import torch

from tests.tensor_sizes import TensorSizeRecorder
from trl_groupopt.core.common import energy_from_log_probs
from trl_groupopt.methods.otb.objective import logit_gradient_energy


def _tiny_causal_lm(vocab: int = 1000):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # a peaked head (logit std ~ 4): energies then depend on the temperature
        model.lm_head.weight.normal_(0.0, 0.7)
    return model


def test_trl_fused_head_energy_matches_plain_logits_and_stays_tiled(monkeypatch):
    trl_utils = pytest.importorskip("trl.trainer.utils")
    kernel = pytest.importorskip("trl.kernels.chunked_logprob")
    vocab, batch, seq, temperature = 1000, 4, 24, 0.7
    model = _tiny_causal_lm(vocab)
    trl_utils.add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy", "log_sum_sq_probs"))

    gen = torch.Generator().manual_seed(5)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[1, -5:] = 0  # right padding
    attention_mask[3, -9:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :6] = -100  # the prompt is not scored
    # TRL shifts inside: position t of the output scores labels[:, t + 1] from hidden[:, t]
    target = labels[:, 1:]  # (B, T-1)
    valid = target != -100

    # `_CHUNKED_LOGPROB_CHUNK_SIZE` is the vocabulary width of a projection tile (read at call time;
    # default 32768 > V here, which would make one tile wider than the logits), and
    # `TOKEN_CHUNK_SIZE` the tokens per tile: shrink both so B * (T-1) = 92 tokens span 3 tiles.
    monkeypatch.setattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 128)
    monkeypatch.setattr(kernel, "TOKEN_CHUNK_SIZE", 32)
    with torch.no_grad(), TensorSizeRecorder() as rec_fused:
        fused = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
    with torch.no_grad(), TensorSizeRecorder() as rec_plain:
        plain = model(input_ids=input_ids, attention_mask=attention_mask, fused_lm_head=False)

    assert fused.log_probs.shape == (batch, seq - 1) and fused.log_sum_sq_probs.shape == (batch, seq - 1)
    energy_fused = energy_from_log_probs(fused.log_probs, fused.log_sum_sq_probs)  # (B, T-1)
    energy_plain = logit_gradient_energy(plain.logits[:, :-1], target.clamp(min=0), temperature)  # (B, T-1)
    torch.testing.assert_close(energy_fused[valid], energy_plain[valid], rtol=0, atol=1e-5)
    assert bool((energy_fused[~valid] == 0).all())  # TRL zero-fills ignored labels: energy 0 there
    # the comparison is not vacuous: energies vary, and the temperature changes them
    assert float(energy_plain[valid].std()) > 0.05
    energy_t1 = logit_gradient_energy(plain.logits[:, :-1], target.clamp(min=0), 1.0)
    assert float((energy_t1[valid] - energy_plain[valid]).abs().max()) > 1e-2

    full = batch * seq * vocab
    assert rec_plain.largest_any >= full  # the recorder sees the plain head's (B, T, V) logits
    assert rec_fused.largest_any < batch * (seq - 1) * vocab, rec_fused.largest
    # tighter: nothing larger than one (32 tokens x 128 vocab) tile or the backbone's MLP activations
    assert rec_fused.largest_any <= max(32 * 128, batch * seq * model.config.intermediate_size), rec_fused.largest
