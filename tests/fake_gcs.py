"""A local Google Cloud Storage for tests of gs:// paths.

`serve()` runs gcp-storage-emulator (the JSON API: listings, ranged
downloads, uploads) on this machine, in this process, where `configure()`
pointed the two GCS clients the checkpoints use:

- tensorstore's gcs kvstore (every array and file read, our listings):
  `TENSORSTORE_GCS_HTTP_URL`, with `GOOGLE_AUTH_TOKEN_FOR_TESTING` for a
  token;
- etils.epath's gs:// paths (orbax's metadata files), through fsspec's
  gcsfs: `STORAGE_EMULATOR_HOST`, and `EPATH_USE_TF=false` (with
  TensorFlow installed, epath would take tf.io.gfile, which has no endpoint
  to redirect).

`configure()` runs once, when the suite starts (tests/conftest.py): orbax
keeps one tensorstore context per process, which reads the endpoint when
orbax first saves or restores anything, local or not.

The emulator ignores a listing's `startOffset` / `endOffset`, which
tensorstore sends for every key range (and not `prefix`): real GCS lists
only the keys in range, the emulator every key of the bucket. `serve`
filters its listings by them, as GCS does.
"""

import contextlib
import os
import pathlib
import socket
from typing import Iterator

BUCKET = 'specdec-test'


def _ranged(ls):
  """The emulator's object listing, keeping only names in
  [startOffset, endOffset) as GCS does."""
  def handler(request, response, *args, **kwargs):
    start = (request.query.get('startOffset') or [''])[0]
    end = (request.query.get('endOffset') or [None])[0]
    send = response.json

    def json(obj):
      if isinstance(obj, dict) and 'items' in obj:
        obj['items'] = [f for f in obj['items'] if start <= f['name'] and (
            end is None or f['name'] < end)]
      send(obj)

    response.json = json
    return ls(request, response, *args, **kwargs)
  return handler


# The port `configure` chose, held between `serve`s so that no other
# process (another xdist worker's `configure`) takes it.
_HELD = []


def _hold(port: int) -> int:
  s = socket.socket()
  s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  s.bind(('127.0.0.1', port))
  _HELD.append(s)
  return s.getsockname()[1]


def configure() -> str:
  """Points this process's GCS clients (and its children's) at a free local
  port, where `serve` will listen; returns its URL."""
  url = f'http://127.0.0.1:{_hold(0)}'
  os.environ.update(TENSORSTORE_GCS_HTTP_URL=url,
                    GOOGLE_AUTH_TOKEN_FOR_TESTING='test',
                    STORAGE_EMULATOR_HOST=url, EPATH_USE_TF='false')
  return url


@contextlib.contextmanager
def serve(monkeypatch) -> Iterator[str]:
  """Serves an empty bucket `BUCKET` at `configure()`'s address; yields
  'gs://BUCKET'."""
  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator import server as emulator
  from gcp_storage_emulator.handlers import objects
  # pylint: enable=g-import-not-at-top
  monkeypatch.setattr(emulator, 'HANDLERS', tuple(
      (regex, {m: _ranged(h) if h is objects.ls else h
               for m, h in handlers.items()})
      for regex, handlers in emulator.HANDLERS))
  port = int(os.environ['TENSORSTORE_GCS_HTTP_URL'].rsplit(':', 1)[1])
  while _HELD:
    _HELD.pop().close()
  server = emulator.create_server('127.0.0.1', port, in_memory=True,
                                  default_bucket=BUCKET)
  server.start()
  try:
    yield f'gs://{BUCKET}'
  finally:
    server.stop()
    with contextlib.suppress(OSError):  # taken meanwhile: not held
      _hold(port)


def upload(local: os.PathLike, address: str) -> str:
  """Copies a local file or folder to a gs:// address; returns it."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  bucket, key = address[len('gs://'):].split('/', 1)
  store = ts.KvStore.open({'driver': 'gcs', 'bucket': bucket}).result()
  local = pathlib.Path(local)
  files = [local] if local.is_file() else sorted(
      p for p in local.rglob('*') if p.is_file())
  for p in files:
    rel = '' if p == local else '/' + p.relative_to(local).as_posix()
    store.write(key + rel, p.read_bytes()).result()
  return address
