"""Everything needed to train and test with no Hub and no GPU: the task's tokenizer, the synthetic arithmetic task
and the embedded policies (docs/embedded-policy.md)."""

from .policy import (
    EMBEDDED_LONG_POLICY_PATH,
    EMBEDDED_POLICY_PATH,
    VARIANTS,
    Variant,
    greedy_accuracy,
    load_embedded_policy,
)
from .task import (
    LONG_CHAIN,
    LONG_CHAIN_MAX_COMPLETION_LENGTH,
    arithmetic_chain_of_thought,
    arithmetic_problems,
    evaluate_expression,
    expression_of_prompt,
    make_arithmetic_dataset,
)
from .tokenizer import CHAT_TEMPLATE, build_tokenizer, save_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "EMBEDDED_LONG_POLICY_PATH",
    "EMBEDDED_POLICY_PATH",
    "LONG_CHAIN",
    "LONG_CHAIN_MAX_COMPLETION_LENGTH",
    "VARIANTS",
    "Variant",
    "arithmetic_chain_of_thought",
    "arithmetic_problems",
    "build_tokenizer",
    "evaluate_expression",
    "expression_of_prompt",
    "greedy_accuracy",
    "load_embedded_policy",
    "make_arithmetic_dataset",
    "save_tokenizer",
]
