"""Drafters: anything that proposes gamma tokens with their distributions q.

The speculative loop talks to a drafter through `interfaces.Drafter`
(`init`, `propose`: drafts and the standardized q they were drawn from, so
the acceptance test is exact; `prefill`, `score`, `check_params`,
`vocab_size`); a drafter whose drafting rides on the target's verification
call is an `interfaces.MergedDrafter` and names its merged loop. A
deterministic drafter returns one-hot q; exactness holds for any q.

One module per method, and a folder per method that has more than a
drafter (a network, a loop, training), in t5x contrib/calm's shape:

  registry.py    DraftSource, DrafterKind, KindTable (imports contracts only)
  t5.py          'T5Drafter': a separate T5 with its own cache ('t5')
  ngram.py       'NgramDrafter': unigram / bigram statistics (paper Table 3)
  lookup.py      'LookupDrafter': prompt lookup, no model ('lookup')
  cache.py       'CacheDrafter': copies from similar earlier requests
  combined.py    'CombinedDrafter': copy where it matches, the T5 elsewhere
  lookahead/     PaSS: the target drafts from look-ahead slots ('pass'; its
                 tree layout: 'pass_tree')
  heads/         self-drafting heads on the target's states ('heads'; token
                 trees: 'heads_tree')
  tree/          token trees: a T5 drafter's tree verified in one call
                 ('tree', its shape DraftSource.tree, gin TREE)

`KINDS` below is the one list of the kinds a job may name (`DrafterSpec.kind`,
gin `DRAFTER`); `python -m specdec_jax.drafters` prints it. A new kind is a
module (or folder) exporting a `registry.DrafterKind` and one line here;
tests/drafters/test_drafters.py then runs it through the per-kind suite.

References: Leviathan et al. 2023, arXiv 2211.17192, sec. 2.3 and Table 3.
"""

from specdec_jax.drafters import cache
from specdec_jax.drafters import combined
from specdec_jax.drafters import heads
from specdec_jax.drafters import lookahead
from specdec_jax.drafters import lookup
from specdec_jax.drafters import ngram
from specdec_jax.drafters import registry
from specdec_jax.drafters import t5
from specdec_jax.drafters import tree
from specdec_jax.drafters.cache import CacheDrafter
from specdec_jax.drafters.cache import open_cache
from specdec_jax.drafters.combined import CombinedDrafter
from specdec_jax.drafters.heads import HeadDrafter
from specdec_jax.drafters.heads import HeadTreeDrafter
from specdec_jax.drafters.lookahead import PassDrafter
from specdec_jax.drafters.lookup import LookupDrafter
from specdec_jax.drafters.ngram import NgramDrafter
from specdec_jax.drafters.ngram import ngram_params
from specdec_jax.drafters.registry import DrafterKind
from specdec_jax.drafters.registry import DraftSource
from specdec_jax.drafters.t5 import T5Drafter
from specdec_jax.drafters.tree import TreeDrafter

KINDS = registry.KindTable(
    t5.KIND,
    ngram.UNIGRAM,
    ngram.BIGRAM,
    lookup.KIND,
    cache.KIND,
    combined.KIND,
    lookahead.KIND,
    lookahead.TREE_KIND,
    heads.KIND,
    tree.KIND,
    heads.TREE_KIND,
)


def get_kind(name: str) -> DrafterKind:
  """The registered kind `name`; ValueError naming the known ones."""
  return KINDS.get_kind(name)
