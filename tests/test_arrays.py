"""Pre-tokenized arrays (specdec_jax/arrays.py) in a bucket as on disk."""

import numpy as np
import pytest

from specdec_jax import arrays
from specdec_jax import checkpoints
from specdec_jax import checks


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
