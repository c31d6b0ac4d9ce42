"""Server mode (`vllm_mode="server"`): TRL's `trl vllm-serve` server for the embedded policy, started and stopped by
the test on 127.0.0.1.

The server generates from the same policy as the trainer (logprobs within `checks.LOGPROB_TOLERANCE` at the trainer's
temperature, far outside it at another). Training needs TRL's weight sync, which runs on vLLM's NCCL weight-transfer
engine: with two GPUs the run is checked like a colocated one; on a CPU the trainer stops at construction, in
`VLLMClient.init_communicator`, and this test pins that (docs/vllm.md): if TRL ever syncs weights without CUDA, the
test fails and the CPU branch should train instead.
"""

import pytest
import torch
from trl.generation.vllm_client import VLLMClient

from trl_groupopt.data.offline import EMBEDDED_POLICY_PATH

from .checks import (
    LOGPROB_TOLERANCE,
    SyncMonitor,
    assert_is_ratios_near_one,
    assert_synced,
    fixed_prompt_ids,
    logprob_gap,
)
from .engine import SKIP_REASON, on_gpu, vllm_installed, vllm_server
from .runs import ROLLOUTS, vllm_trainer

pytestmark = pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON)  # marked vllm and slow by folder


def test_server_mode(vllm_shims, tmp_path):
    scorer = vllm_trainer("grpo", tmp_path / "scorer", use_vllm=False)  # the trainer side of the comparison
    prompt_ids = fixed_prompt_ids(scorer)
    with vllm_server(EMBEDDED_POLICY_PATH, tmp_path / "server.log") as base_url:
        client = VLLMClient(base_url=base_url, connection_timeout=30)

        def served_at(temperature: float):
            def served(prompts):
                out = client.generate(
                    prompts, n=1, temperature=temperature, max_tokens=scorer.max_completion_length, logprobs=0
                )
                return out["completion_ids"], [[lp[0] for lp in seq] for seq in out["logprobs"]]

            return served

        assert logprob_gap(scorer, prompt_ids, served_at(scorer.temperature)) <= LOGPROB_TOLERANCE
        # and the comparison sees the processing: vLLM at temperature 1 against the trainer's logits / 0.7
        assert logprob_gap(scorer, prompt_ids, served_at(1.0)) > 100 * LOGPROB_TOLERANCE

        server_args = dict(vllm_mode="server", vllm_server_base_url=base_url, vllm_server_timeout=30)
        if torch.cuda.device_count() >= 2:
            trainer = vllm_trainer("grpo", tmp_path / "run", **server_args)
            monitor = SyncMonitor(trainer, prompt_ids)
            trainer.train()
            assert_synced(monitor.records, ROLLOUTS)
            assert_is_ratios_near_one(trainer.state.log_history, ROLLOUTS)
        elif on_gpu():
            pytest.skip("server-mode training needs a second GPU for the server (one NCCL rank per device)")
        else:
            with pytest.raises(NotImplementedError, match="NCCL weight-transfer engine, which needs a CUDA device"):
                vllm_trainer("grpo", tmp_path / "run", **server_args)
