"""Builds the offline Debian tasks' data (EN->DE translation, synopses).

Reads apt's `*_i18n_Translation-{en,de}*` lists (Debian's package
descriptions and their German translations) and writes
`OUT_DIR/<task>/<split>.jsonl` of debian_desc_en_de and debian_synopsis,
split 90/5/5 by a hash of each example's source text, and a SentencePiece
model trained on the train text with T5's conventions; the library is
specdec_jax/debian.py.

The lists must be downloaded first (a plain `apt-get update` drops German):

  apt-get update -o Acquire::Languages=de,en   # or pass --fetch
  python scripts/build_debian_data.py --out_dir ~/.cache/specdec_jax/debian

specdec_jax.tasks reads OUT_DIR (`SPECDEC_DATA_DIR`, or `data_dir=`). This
script needs neither TensorFlow nor seqio.
"""

import argparse

from specdec_jax import checks
from specdec_jax import debian
from specdec_jax import tasks


def main(argv=None):
  """Parses flags, builds the data and prints the counts."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out_dir', type=checks.local_path, required=True)
  parser.add_argument('--lists_dir', default=None,
                      help="apt's lists folder (default: apt-config's).")
  parser.add_argument('--fetch', action='store_true',
                      help=f'run `{tasks.APT_COMMAND}` when lists are '
                      'missing.')
  parser.add_argument('--vocab_size', type=checks.count, default=8000)
  parser.add_argument('--vocab_file', default=None,
                      help='copy this SentencePiece model instead of training '
                      'one (e.g. the shipped models\' vocabulary, '
                      'specdec_jax/assets/mini/data/sentencepiece.model, to '
                      'train or distill on the full data for them).')
  parser.add_argument('--max_examples', type=checks.count, default=None,
                      help='keep the first N examples per task and split.')
  parser.add_argument('--normalization', default='nmt_nfkc',
                      help='SentencePiece normalization rule of a model to '
                      f'train: {", ".join(debian.NORMALIZATIONS)} (the text '
                      'is already NFKC; "identity" makes a smaller model).')
  parser.add_argument('--num_threads', type=checks.count, default=2)
  args = parser.parse_args(argv)
  debian.check_build(args.out_dir, args.vocab_file,  # before any work
                     args.normalization)
  files = debian.find_lists(args.lists_dir, args.fetch)
  debian.build(files, args.out_dir, vocab_size=args.vocab_size,
               vocab_file=args.vocab_file, max_examples=args.max_examples,
               normalization=args.normalization,
               num_threads=args.num_threads)


if __name__ == '__main__':
  checks.run_main(main)  # a refused value or file: its line
