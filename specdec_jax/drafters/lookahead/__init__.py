"""PaSS: the target drafts for itself with learned look-ahead embeddings.

PaSS (Monea, Joulin & Grave 2023, arXiv 2311.13581) appends L learned
"look-ahead" input embeddings after the decoder's last real token; the
target's logits at look-ahead slot j are a draft distribution for the j-th
token after the next one. Only the L x emb_dim embeddings are trained (the
target is frozen); drafts are verified by speculative sampling (Leviathan et
al. 2023, Algorithm 1), so outputs follow the target's law in every sampling
mode.

Here, for T5X encoder-decoders (`network.T5Model`):

- `network.Decoder.extend(..., lookahead, lookahead_start)` puts the slots in
  a decoding block; they stand for the positions after the row's last real
  token; callers drop them with `cache.rewind`. `model.lookahead_logits` is
  the teacher-forced twin (every prefix position t gets its own L slots,
  each seeing the real tokens :t+1 and the slots before it), used for
  training (`train.loss_fn`, scripts/train_pass.py) and for alpha per
  look-ahead position (`train.position_alpha`).
- `drafter.PassDrafter`, kind `'pass'`: an `interfaces.MergedDrafter`. In
  the ordinary loop (`speculative_sample(..., merged=False)`) it is an
  `interfaces.Drafter` making one target call per `propose` on
  [the committed tokens its own cache lacks, slot_1..slot_L]. Draft 1 comes
  from the target's own next-token logits (q_1 = p_1 up to rounding), draft
  i >= 2 from slot i-1, so gamma <= L + 1. It keeps its own copy of the
  target's decoder cache (memory: one more target decoder cache, batch x
  (max_len + 2L + 2) x layers x 2 x heads x head_dim); the target's weights
  are shared, not copied. q_i for i >= 2 depends on the prefix only, not on
  drafts 1..i-1: exactness needs only x_i ~ q_i with that q_i handed to the
  verification (it is); `score` gives q_1's logits (the target's).
- `loop.LookaheadLoop`: the merged draft+verify loop, what
  `speculative.speculative_sample` runs by default. One target call per
  iteration on [last committed, x_1..x_gamma, slot_1..slot_L] (gamma <= L):
  positions 0..gamma verify this iteration's drafts, the slots after x_gamma
  draft the next iteration's. No drafter call at all.

Rejection handling (merged loop). The slots after x_gamma are conditioned on
all gamma drafts and stand for positions after x_gamma; they are only
aligned with the committed prefix when every draft was accepted (then the
bonus token is the token at x_gamma's position + 1 and slot j predicts the
j-th token after it). After a rejection at n < gamma they would still be
*valid* proposals (exactness does not depend on them) but for the wrong
positions, so nearly worthless. They are dropped: the next iteration of that
row is a "recovery" call on [last committed, slot_1..slot_L, pad]: q = 0
everywhere (no drafts; `speculative.verify` then draws the next token from
p_1, i.e. Algorithm 1 with gamma = 0), and its slots, now right after the
committed prefix, draft the iteration after. Both kinds of rows share one
compiled (gamma + 1 + L)-token call, L = gamma (the loop keeps the
first gamma slots; the slots' place in the block is per row:
`lookahead_start`). A recovery iteration commits one token, as a baseline
step would, at the cost of one (gamma+1+L)-token call.
`PassDrafter(..., tree=True)` (kind 'pass_tree') avoids recovery calls: one
group of gamma slots after each of last, x_1..x_gamma ((gamma + 1)^2 tokens
per call, group h seeing only the prefix up to x_h, `model.tree_extend`),
and group n drafts the next iteration whatever n is. On the shipped target
it yields more tokens per call than the plain layout at gamma 1-4
(results/lookahead/shipped.md).

Parameters: `{'lookahead_embedder': {'embedding': [L, emb_dim]}}` (T5X's
naming of `token_embedder`), saved and loaded as a T5X orbax checkpoint
beside the target's (`model.save_lookahead`, `model.load_lookahead`, which
refuses embeddings of another emb_dim); the shipped ones are
`shipped:lookahead/<task>`.

Files (t5x contrib/calm's shape): `model.py` parameters and forwards,
`loop.py` the merged loop, `drafter.py` the drafter and its kind,
`train.py` training and alpha per slot (imported by scripts/train_pass.py,
not by decoding).
"""

from specdec_jax.drafters.lookahead.drafter import DEFAULT_LOOKAHEAD
from specdec_jax.drafters.lookahead.drafter import KIND
from specdec_jax.drafters.lookahead.drafter import TREE_KIND
from specdec_jax.drafters.lookahead.drafter import PassDrafter
from specdec_jax.drafters.lookahead.drafter import pass_params
from specdec_jax.drafters.lookahead.loop import LookaheadLoop
from specdec_jax.drafters.lookahead.model import KEY
from specdec_jax.drafters.lookahead.model import check_lookahead
from specdec_jax.drafters.lookahead.model import embeddings
from specdec_jax.drafters.lookahead.model import init_lookahead
from specdec_jax.drafters.lookahead.model import load_lookahead
from specdec_jax.drafters.lookahead.model import lookahead_logits
from specdec_jax.drafters.lookahead.model import save_lookahead
