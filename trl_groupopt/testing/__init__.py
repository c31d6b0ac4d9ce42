"""The contract: the math every policy objective and every advantage estimator must satisfy, checked on random and
extreme tensors (no model, no trainer loop). The shared training tests check the wiring; this checks the math.

``check_objective(name)`` takes a registered method (shipped, or a user's registered before the call), builds its
config with the defaults, calls its trainer's ``objective`` on tensors (a stand-in trainer that holds only what TRL's
``GRPOTrainer.__init__`` derives from the config, one process, training mode) and aggregates the per-token loss as the
trainer does (`trl_groupopt.trainer.loss.aggregate`, the config's ``loss_type``, one micro-batch). The inputs
(`trl_groupopt.testing.inputs`): 3 groups of 4 rows, ragged masks, one advantage per row summing to 0 in each group
as TRL's do. Properties (each failure names the property and the input that shows it):

- ``gradient sign``: on-policy (old = current log-probs), d loss / d log p of every valid token has the sign of minus
  its sequence's advantage (descent raises the log-probability of positive-advantage tokens): random inputs, both
  signs, ragged masks (an objective whose trainer declares ``gradient_couples_tokens``, a batch-wide term in every
  token's gradient, must instead have ``sum A * d loss / d log p < 0``: descent raises ``sum A log p``);
- ``equals GRPO on-policy`` (where the spec declares ``on_policy_equals="grpo"``): value and gradient equal TRL's
  clipped surrogate (`trl_groupopt.core.common.clipped_surrogate_loss`) at ratio 1, within `FLOAT64_RTOL`;
- ``masked tokens``: off-policy, every masked token gets exactly zero gradient, and changing masked tokens' log-probs
  (current and old) changes neither the loss nor any gradient (exactly);
- ``float32 agrees with float64``: loss and gradient on the same inputs within `FLOAT32_RTOL` (relative to the largest
  magnitude of each);
- ``finite at extremes``: finite loss and gradient for log-ratios of +-20, advantages of +-1e6 and 0, an empty row,
  and a group whose rewards were all equal (its advantages 0), in float32;
- ``no host sync``: the objective's forward neither reads a value on the host (``.item()``, ``.tolist()``,
  ``float(t)``, ``bool(t)``, ``.cpu()``, ``.numpy()``) nor runs an op whose output shape depends on the data
  (``nonzero``, ``masked_select``, ``unique``, boolean indexing, ...): each would stall a GPU on every micro-batch;
- ``row permutation``: permuting the rows inside a group permutes the per-row loss (every objective; it matters for
  those that couple a group's rows).

``check_estimator(name)`` takes a registered advantage estimator (`trl_groupopt.core.estimators.ESTIMATORS`) with its
knobs' defaults and checks: ``constant group``: a group whose rewards are all equal gets advantage 0 (rewards exactly
representable in float32: TRL centres by the group mean, whose rounding residue the trainer's equal-reward rule
zeroes); ``reward shift`` (where the estimator declares ``shift_invariant``): adding a constant to every reward of a
group leaves the advantages unchanged (within `FLOAT32_RTOL`); ``finite at extremes``: rewards of +-1e6, 0, a NaN
(unscorable) row and an empty row give finite advantages; ``no host sync``, as for objectives.

Run it for your own method in a test file (docs/contract.md), or ``python -m trl_groupopt.testing --import my_methods``::

    import my_methods  # registers "my_method"
    from trl_groupopt.testing import check_objective

    def test_my_method_contract():
        check_objective("my_method")
"""

from __future__ import annotations

from .estimator import check_estimator
from .host_sync import HostSyncError, no_host_sync
from .inputs import FLOAT32_RTOL, FLOAT64_RTOL
from .objective import check_objective

__all__ = ["FLOAT32_RTOL", "FLOAT64_RTOL", "HostSyncError", "check_estimator", "check_objective", "no_host_sync"]
