"""Tests against a real vLLM engine (marker `vllm`): skipped where vLLM is not installed; see docs/vllm.md."""
