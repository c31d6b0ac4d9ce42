"""Everything needed to train and test with no Hub and no GPU.

- :mod:`.tokenizer`: the task's character-level tokenizer, built in code (:func:`build_tokenizer`).
- :mod:`.task`: the synthetic arithmetic task (:func:`make_arithmetic_dataset`).
- :mod:`.policy`: the embedded 1 M-parameter policy (:data:`EMBEDDED_POLICY_PATH`, :func:`load_embedded_policy`)
  and :func:`greedy_accuracy` to measure a policy on the held-out split.
"""

from .policy import EMBEDDED_POLICY_PATH, greedy_accuracy, load_embedded_policy
from .task import (
    arithmetic_chain_of_thought,
    arithmetic_problems,
    evaluate_expression,
    expression_of_prompt,
    make_arithmetic_dataset,
)
from .tokenizer import CHAT_TEMPLATE, build_tokenizer, save_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "EMBEDDED_POLICY_PATH",
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
