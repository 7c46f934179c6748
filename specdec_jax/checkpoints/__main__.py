"""`python -m specdec_jax.checkpoints`: seal and verify T5X checkpoints.

  python -m specdec_jax.checkpoints seal PATH       # writes MANIFEST.json
  python -m specdec_jax.checkpoints verify PATH...  # checks every file

T5X writes no checksums, so a checkpoint copied with a byte changed, or
cut short, can load as other weights. `seal` records the sha256 and size of
every file of a checkpoint folder that has no manifest (T5X's own), once
its files are known good; from then on every `load_t5x_params` of it, and
`verify`, checks them. `verify` reads the files, not the arrays: it loads no
model. PATH is what `load_t5x_params` takes (local or gs://; a model dir
means its latest step). Exit status 1 names what failed.
"""

import argparse
import sys
from typing import Optional, Sequence

from specdec_jax.checkpoints import t5x


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m specdec_jax.checkpoints',
      description=__doc__.split('\n\n')[2].replace('\n', ' '))
  commands = parser.add_subparsers(dest='command', required=True)
  seal = commands.add_parser('seal', help='write MANIFEST.json into a '
                             'checkpoint that has none')
  seal.add_argument('path')
  verify = commands.add_parser('verify', help="check checkpoints' files "
                               'against their manifests')
  verify.add_argument('paths', nargs='+', metavar='path')
  args = parser.parse_args(argv)
  try:
    if args.command == 'seal':
      print(f'sealed: {t5x.seal_checkpoint(args.path)}')
      return 0
    for path in args.paths:
      got = t5x.verify_checkpoint(path)
      print(f"{got['checkpoint']}: {got['files']} files "
            f"({got['bytes'] / 1e9:.3f} GB) match {got['manifest']}")
  except (t5x.CheckpointError, FileNotFoundError, FileExistsError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
