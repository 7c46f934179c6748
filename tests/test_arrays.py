"""Pre-tokenized arrays (specdec_jax/arrays.py) in a bucket as on disk."""

import pathlib
import runpy

import numpy as np
import pytest

from command_line import run_script
from specdec_jax import arrays
from specdec_jax import checkpoints
from specdec_jax import checks
from specdec_jax import tasks

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _rows(n, seed):
  rows = np.random.default_rng(seed).integers(2, 30, (n, 5)).astype(np.int32)
  return {'inputs': rows, 'targets': rows[:, :3]}


@pytest.mark.parametrize('where', ['local', 'gs'])
def test_a_split_reads_back_whole_or_from_its_shards(where, tmp_path,
                                                     request):
  """`<split>.npz` then its shards in order (distill's tagged ones too),
  the same from a gs:// folder (a training ARRAY_DIR or a method script's
  --arrays there once read no split) as from a local one."""
  folder = (str(tmp_path / 'a') if where == 'local' else
            request.getfixturevalue('gcs') + '/a')
  parts = [_rows(4, 0), _rows(3, 1), _rows(2, 2)]
  for name, part in zip(['train.npz', 'train-g-00001-of-00002.npz',
                         'train-g-00000-of-00002.npz'], parts):
    arrays.save(f'{folder}/{name}', part)
  arrays.save(f'{folder}/sub/train.npz', _rows(5, 3))  # not the split's
  got = arrays.load(folder, 'train')
  want = [parts[0], parts[2], parts[1]]
  for key in ('inputs', 'targets'):
    np.testing.assert_array_equal(
        got[key], np.concatenate([p[key] for p in want]))
  assert sorted(checkpoints.list_files(folder)) == [
      'sub/train.npz', 'train-g-00000-of-00002.npz',
      'train-g-00001-of-00002.npz', 'train.npz']  # nothing left beside
  with pytest.raises(FileNotFoundError, match=f"No 'test' split in "
                     f"'{folder}'"):
    arrays.load(folder, 'test')


def test_another_url_is_refused(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(checks.InputError, match='a local path or a gs://'):
    arrays.save('s3://b/train.npz', _rows(2, 0))
  assert not list(tmp_path.iterdir())


def test_export_refuses_an_out_dir_in_a_file_at_once(tmp_path):
  (tmp_path / 'file').write_text('')
  proc = run_script('export_arrays', '--out_dir', str(tmp_path / 'file'),
                    '--data_dir', str(tmp_path / 'no_data'), check=False)
  assert proc.returncode == 1, proc.stderr
  assert proc.stderr.startswith("error: --out_dir '"), proc.stderr


def test_export_says_which_split_is_empty(monkeypatch):
  class Empty:  # a task whose split has no example
    def get_dataset(self, **unused_kwargs):
      return self

    def as_numpy_iterator(self):
      return iter(())

  monkeypatch.setattr(tasks, 'get_task', lambda name: Empty())
  export_task = runpy.run_path(
      str(ROOT / 'scripts' / 'export_arrays.py'))['export_task']
  with pytest.raises(checks.InputError,
                     match="split 'test' of task 'x' is empty"):
    export_task('x', {'inputs': 4, 'targets': 3}, 'test')
