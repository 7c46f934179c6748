r"""Runs a benchmark spec: `python -m specdec_jax.experiments run <spec>`.

  python -m specdec_jax.experiments list
  python -m specdec_jax.experiments run table2 --models xxl_cost [--shrink]
      [--tasks en_de] [--where batch_gamma=always] [--num_partitions 4]
  python -m specdec_jax.experiments repredict results/table2/shipped.json

Every cell of a spec is the eval job on its setup (`sweep`); a rerun
resumes (the cells' folders are in --work_dir). `repredict` recomputes a
results file's predicted figures (measuring none). The flags: `--help`;
the specs, the model sets and the mesh: docs/experiments.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from specdec_jax import bucket_folder
from specdec_jax import checks
from specdec_jax import eval as eval_lib
from specdec_jax import task_table
from specdec_jax.bench import flags
from specdec_jax.bench import report
from specdec_jax.experiments import specs
from specdec_jax.experiments import sweep
from specdec_jax.experiments import table

PROG = 'python -m specdec_jax.experiments'


def parse_args(argv: Sequence[str]):
  p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  sub = p.add_subparsers(dest='command', required=True)
  sub.add_parser('list', help='the specs and their cells')
  r = sub.add_parser('run', help='run (or resume) a spec')
  r.add_argument('spec', choices=sorted(specs.SPECS), help='a spec')
  r.add_argument('--models', default='shipped',
                 choices=list(task_table.MODEL_SETS),
                 help="'shipped': the package's models; 'mini': models "
                 "trained here (--models_dir); 'paper': T5X checkpoints "
                 "(--checkpoints); 'xxl_cost': the shipped models widened "
                 "to the paper's costs (target T5 1.1-XXL); 'synthetic': a "
                 "random target and noisy copies of it as drafters, at "
                 "the same costs (no weights)")
  r.add_argument('--models_dir', default='~/models')
  r.add_argument('--checkpoints', default='',
                 help='--models paper: en_de_xxl=PATH,en_de_small=PATH,...')
  r.add_argument('--data_dir', default=None,
                 help="the Debian data (default: the model set's gin files')")
  r.add_argument('--tasks', default=None,
                 help='comma-separated task_table names (default: all)')
  r.add_argument('--num_examples', type=checks.count, default=None)
  r.add_argument('--repeats', '--timing_repeats', type=checks.count,
                 help="timed repeats of each unit (default: the spec's)")
  r.add_argument('--shrink', action='store_true',
                 help='tiny rows: the spec end to end in seconds')
  r.add_argument('--only', default=None, metavar='CELL',
                 help='decode only this cell')
  r.add_argument('--where', action='append', default=[], metavar='FIELD=VALUE',
                 help="only the cells whose field has this value (one of "
                 "'a|b'), e.g. batch_gamma=always; repeatable")
  r.add_argument('--work_dir', default='~/.cache/specdec_jax/experiments',
                 help="the cells' folders, local or gs:// (a rerun resumes)")
  r.add_argument('--out', default=None,
                 help='results path without suffix, local or gs:// (default: '
                 'results/<spec>/<models>; --shrink: in the work folder)')
  r.add_argument('--model_fields', action='append', default=[],
                 metavar='FIELD=VALUE', help="a T5Config field of every "
                 'model, e.g. attention_kernel=cudnn; repeatable')
  r.add_argument('--max_minutes', type=checks.positive, default=24 * 60.0,
                 help='start no cell after this many minutes')
  r.add_argument('--num_partitions', type=checks.count, default=None,
                 help="the cells on a mesh: its 'model' axis size")
  r.add_argument('--global_mesh', action='store_true',
                 help="the cells on one mesh of every process's devices")
  r.add_argument('--shard_drafter', action='store_true',
                 help="on the mesh, a T5 drafter sharded as the target is "
                 '(default: replicated)')
  eval_lib.add_process_flags(r)
  flags.add_prediction_flags(r, optional=True, repredict=False)
  q = sub.add_parser('repredict', help="a results file's predicted figures "
                     'from its measured values')
  q.add_argument('results', metavar='JSON', help='local or gs://')
  flags.add_prediction_flags(q, optional=True, repredict=False)
  return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  command = ' '.join([PROG] + argv)
  if args.command == 'list':
    for name, spec in sorted(specs.SPECS.items()):
      cells = sweep.plan(spec, sweep.options_of(spec, sweep.Options()))
      print(f'{name}: {spec.title} ({len(cells)} cells, shipped models)')
    return None
  with checks.one_line(OSError, ValueError):  # a --profile that is none
    profile = flags.profile_of(args, optional=True)
  if args.command == 'repredict':  # results local or gs://, in place
    with checks.one_line(OSError, ValueError, LookupError, TypeError,
                         AttributeError, said=f'{args.results} is no '
                         'results file to repredict: '):  # read before a write
      result = report.read_json(args.results)
      spec = specs.get(result['spec'])
      table.markdown(spec, table.repredict(spec, result, profile, command))
    out = os.path.splitext(args.results)[0]
    with bucket_folder.written_here('results', out, table.SUFFIXES) as (at, _):
      return table.write(spec, result, out, here=at)
  spec = specs.get(args.spec)
  eval_lib.initialize_distributed(args)
  with checks.one_line(ValueError):  # flags, tasks, cells: before any load
    options = sweep.Options(
        models=args.models,
        tasks=None if args.tasks is None else tuple(args.tasks.split(',')),
        num_examples=args.num_examples, timing_repeats=args.repeats,
        shrink=args.shrink, only=args.only, where=tuple(args.where),
        work_dir=args.work_dir, models_dir=args.models_dir,
        checkpoints=args.checkpoints, data_dir=args.data_dir,
        max_minutes=args.max_minutes, model_fields=tuple(args.model_fields),
        num_partitions=args.num_partitions, global_mesh=args.global_mesh,
        shard_drafter=args.shard_drafter)
    sweep.plan(spec, sweep.options_of(spec, options))
  with checks.one_line(sweep.CellsFailed, *checks.REFUSED):
    return sweep.run(spec, options, profile=profile, command=command,
                     out=args.out)


if __name__ == '__main__':
  with eval_lib.exits_at_once():  # across processes: at once, not at exit
    checks.run_main(main)  # a signal's end: out at once
