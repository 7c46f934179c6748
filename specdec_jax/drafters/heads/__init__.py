"""Self-drafting heads: the frozen target drafts from its own final state.

A small trainable head reads the target's normalized final decoder state h_t
(the state whose logits gave token y_{t+1}) and the embedding of y_{t+1},
predicts the next state h'_{t+1}, and drafts y_{t+2} from it through the
target's own (frozen) logits layer; fed its own state and draft, it drafts
y_{t+3}, ... (sequentially dependent heads: Hydra, Ankner et al. 2024;
feature-level drafting: EAGLE, Li et al. 2024; one head per offset without
the token: Medusa, Cai et al. 2024). Where PaSS's look-ahead embeddings (`drafters.lookahead`) stay
at alpha 0.14 on our 4-layer target, this is the same frozen target, a few trained
parameters beside it, no second model, and drafting attached to the
verification call.

    x   = s + out(attend(query([s; E y]), K_L, V_L))    (cross_attention)
    s'  = x + wo(gelu(wi([x; E y])))
    q   = softmax(s' @ W_logits / temperature ...)      (the target's head)

E and W_logits are the target's token embedding and logits layer, K_L / V_L
its last decoder layer's cross-attention keys and values of the encoder
output (already in the decoder cache: nothing recomputed). `out` and `wo`
start at zero, so an untrained head drafts the target's distribution at the
previous position. Parameters (`init_head`): `{'draft_head': {'wi', 'wo'
[, 'query', 'out']}}`, a few hundred thousand for the shipped target.

Decoding (`loop.HeadLoop`, the merged loop, what
`speculative.speculative_sample` runs by default): one (gamma + 1)-token target
call per iteration on [last committed, x_1..x_gamma] returns logits AND
final states; verification (`speculative.accept_and_commit`) accepts n
drafts and commits the residual / bonus token y; the head then drafts the
next gamma tokens from (h_n, y): h_n is the state at block position n, the
one whose distribution y was drawn from, whatever n is, so no iteration is
lost to a rejection (PaSS's recovery calls). Draft i is drawn from q_i,
which depends on drafts 1..i-1 (ordinary autoregressive drafting): exact
under Algorithm 1 for every sampling mode, greedy identical to the baseline.
Cost per iteration: one (gamma + 1)-token target call + gamma head steps (a
few small matmuls and the target's logits matmul each: c of a head step,
not 0; `head_step_bytes`).

Token trees (kind 'heads_tree', `drafter.HeadTreeDrafter`,
`loop.HeadTreeLoop`): the pending drafts are a tree (`drafters.tree`)
verified in one target call with the tree mask, which returns the states
too; after the walk the head drafts the next tree from (the state at the
last accepted node, the committed token y): the root's head step gives
its children, each node of a level is stepped from its parent's state and
its token, children and parents chosen by `drafters.tree.grow`'s rules
(the T5 tree drafter's). Cost per iteration: one target call on the tree,
one head step per level (on all its nodes at once).

`drafter.HeadDrafter` (kind 'heads', an `interfaces.MergedDrafter`) runs in
the ordinary loop too (`speculative_sample(..., merged=False)`): its
`propose` runs the target on the committed tokens its own cache copy lacks
(draft 1 from the target's own next-token logits, q_1 = p_1), then the head
from that state; exact, but it pays a second target call per iteration.

Training (`train.chain_loss`, scripts/train_heads.py): on the target's own
outputs, from its teacher-forced states (`target_features`), the head
unrolled `depth` steps on its own predicted states with the true tokens,
cross-entropy on each step's next token; the target's params are not an
argument of the gradient.

Files (t5x contrib/calm's shape): `model.py` the head network and its
parameters (the shipped heads are `shipped:heads/<task>`), `loop.py` the
merged loops (chains, trees), `drafter.py` the drafters and their kinds,
`train.py` training and alpha per depth (imported by scripts/train_heads.py,
not by decoding).
"""

from specdec_jax.drafters.heads.drafter import KIND
from specdec_jax.drafters.heads.drafter import TREE_KIND
from specdec_jax.drafters.heads.drafter import HeadDrafter
from specdec_jax.drafters.heads.drafter import HeadTreeDrafter
from specdec_jax.drafters.heads.drafter import head_params
from specdec_jax.drafters.heads.loop import HeadLoop
from specdec_jax.drafters.heads.loop import HeadTreeLoop
from specdec_jax.drafters.heads.model import CONFIG_FILE
from specdec_jax.drafters.heads.model import KEY
from specdec_jax.drafters.heads.model import Head
from specdec_jax.drafters.heads.model import HeadConfig
from specdec_jax.drafters.heads.model import check_head
from specdec_jax.drafters.heads.model import HEAD_KERNELS
from specdec_jax.drafters.heads.model import head_step_bytes
from specdec_jax.drafters.heads.model import head_step_c
from specdec_jax.drafters.heads.model import init_head
from specdec_jax.drafters.heads.model import load_head
from specdec_jax.drafters.heads.model import save_head
