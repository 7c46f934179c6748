"""Token trees: many drafts verified in one target call.

A chain of gamma drafts yields at most ~1 / (1 - alpha) tokens per target
call however long it is; on an accelerator a target call on k tokens costs
about what one token does up to large k, so the free width goes to a TREE
of drafts verified at once (SpecInfer, Medusa, EAGLE-2, Sequoia), here for
an encoder-decoder T5 in one jitted loop:

  shape.py    `TreeShape`: slots per level, static or dynamic (EAGLE-2:
              parents ranked by the drafter's cumulative probability);
              `best` / `choose`: the shape with the most tokens per
              second on a device (`TreeCosts`: its target and level
              times)
  verify.py   exact verification: greedy argmax walk; sampled: multi-step
              speculative sampling by the drafter's sibling rule, without
              replacement (Sequoia; `grow.py`'s trees) or with (SpecInfer)
  grow.py     `grow`: a tree drafted level by level, the one home of the
              drafting rules (children, dynamic parents, re-ranking)
  drafter.py  `TreeDrafter`: a T5 drafter drafting level by level
  loop.py     `TreeLoop`: the `speculative.VerifyLoop` that runs it

The kind 'tree' is a T5 drafter drafting trees of the shape `TREE`
(`DraftSource.tree`, a `shape.parse` spec): `speculative_sample` runs
`TreeDrafter.merged_loop`, and the streaming loops refill its rows like
any other. The kind 'heads_tree' (`drafters.heads`) grows its trees with
the self-drafting heads by the same rules and verifies them by the same
loop.
"""

from specdec_jax.drafters.tree import shape
from specdec_jax.drafters.tree import verify
from specdec_jax.drafters.tree.drafter import DEFAULT_TREE
from specdec_jax.drafters.tree.drafter import KIND
from specdec_jax.drafters.tree.drafter import TreeDrafter
from specdec_jax.drafters.tree.shape import TreeShape
