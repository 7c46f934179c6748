"""A local Google Cloud Storage for tests of gs:// paths.

`serving()` runs gcp-storage-emulator (the JSON API: listings, ranged
downloads, uploads) on this machine, in this process, where `configure()`
pointed the two GCS clients the checkpoints use; `new_bucket()` gives an
empty bucket of it. The clients:

- tensorstore's gcs kvstore (every array and file read, our listings):
  `TENSORSTORE_GCS_HTTP_URL`, with `GOOGLE_AUTH_TOKEN_FOR_TESTING` for a
  token;
- etils.epath's gs:// paths (orbax's metadata files), through fsspec's
  gcsfs: `STORAGE_EMULATOR_HOST`, and `EPATH_USE_TF=false` (with
  TensorFlow installed, epath would take tf.io.gfile, which has no endpoint
  to redirect).

`configure()` runs once, when the suite starts (tests/conftest.py): orbax
keeps one tensorstore context per process, which reads the endpoint when
orbax first saves or restores anything, local or not. The emulator serves
the whole session (the `gcs` fixtures of tests/conftest.py), and each test
gets a bucket of its own.

The emulator sends no x-goog-generation header with an object's bytes:
tensorstore then reads generation 0, and a write conditional on it (an
OCDBT manifest committed twice in one save, now and then) fails
"Malformed StorageGeneration". Its reads here send the object's
generation, as GCS does.

The emulator reads an upload of an empty object as one without a body and
fails it (tensorstore then retries for ever): its uploads here take an
empty body as an empty object, as GCS does. It writes and deletes
regardless of a request's `ifGenerationMatch`: here, as GCS, only an
object of that generation (0: none) is written or deleted. It ignores a
listing's `startOffset` / `endOffset`, which
tensorstore sends for every key range (and not `prefix`): real GCS lists
only the keys in range, the emulator every key of the bucket. Its listings
here are filtered by them, as GCS does.
"""

import contextlib
import http
import itertools
import json
import os
import pathlib
import socket
from typing import Iterator
import urllib.request

_BUCKETS = itertools.count()
# The port `configure` chose, held until the emulator listens on it, so that
# no other process (another xdist worker's `configure`) takes it meanwhile.
_HELD = []


def _ranged(ls):
  """The emulator's object listing, keeping only names in
  [startOffset, endOffset) as GCS does."""
  def handler(request, response, *args, **kwargs):
    start = (request.query.get('startOffset') or [''])[0]
    end = (request.query.get('endOffset') or [None])[0]
    send = response.json

    def json_response(obj):
      if isinstance(obj, dict) and 'items' in obj:
        obj['items'] = [f for f in obj['items'] if start <= f['name'] and (
            end is None or f['name'] < end)]
      send(obj)

    response.json = json_response
    return ls(request, response, *args, **kwargs)
  return handler


def _empty_uploads(insert):
  """The emulator's upload, taking an empty body for an empty object as
  GCS does (the emulator reads it as no body, fails, and tensorstore
  retries the upload for ever)."""
  def handler(request, response, *args, **kwargs):
    if request.data is None and request.query.get('uploadType') == ['media']:
      request._data = b''  # pylint: disable=protected-access
    return insert(request, response, *args, **kwargs)
  return handler


def _generation_headers(read):
  """The emulator's reads of an object (a download, a get), sending the
  object's generation in the headers as GCS does (x-goog-generation,
  x-goog-metageneration): without them tensorstore reads generation 0, and
  a write conditional on what it read (an OCDBT manifest's second commit)
  fails 'Malformed StorageGeneration'."""
  def handler(request, response, storage, *args, **kwargs):
    try:
      obj = storage.get_file_obj(request.params['bucket_name'],
                                 request.params['object_id'])
    except Exception:  # pylint: disable=broad-except
      obj = None  # the download itself answers 404
    if obj is not None:
      response['x-goog-generation'] = str(obj['generation'])
      response['x-goog-metageneration'] = str(obj['metageneration'])
    return read(request, response, storage, *args, **kwargs)
  return handler


def _preconditions(write):
  """The emulator's upload or delete of an object, done only if the
  object's generation is the request's `ifGenerationMatch` (0: there is
  no object) and else answered 412, as GCS does (the emulator writes
  regardless: a lease taken twice)."""
  def handler(request, response, storage, *args, **kwargs):
    want = request.query.get('ifGenerationMatch')
    if want is not None:
      name = (request.params.get('object_id') or
              (request.query.get('name') or [None])[0])
      try:
        obj = storage.get_file_obj(request.params['bucket_name'], name)
      except Exception:  # pylint: disable=broad-except
        obj = None
      if str(obj['generation'] if obj else 0) != want[0]:
        response.status = http.HTTPStatus.PRECONDITION_FAILED
        return None
    return write(request, response, storage, *args, **kwargs)
  return handler


def configure() -> str:
  """Points this process's GCS clients (and its children's) at a free local
  port, where the emulator will listen; returns its URL."""
  held = socket.socket()
  held.bind(('127.0.0.1', 0))
  _HELD.append(held)
  url = f'http://127.0.0.1:{held.getsockname()[1]}'
  os.environ.update(TENSORSTORE_GCS_HTTP_URL=url,
                    GOOGLE_AUTH_TOKEN_FOR_TESTING='test',
                    STORAGE_EMULATOR_HOST=url, EPATH_USE_TF='false')
  return url


@contextlib.contextmanager
def serving() -> Iterator[str]:
  """Runs the emulator at `configure()`'s address; yields its URL."""
  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator import server as emulator
  from gcp_storage_emulator.handlers import objects
  # pylint: enable=g-import-not-at-top
  url = os.environ['TENSORSTORE_GCS_HTTP_URL']
  handlers = emulator.HANDLERS
  patched = {objects.ls: _ranged,
             objects.insert: lambda h: _preconditions(_empty_uploads(h)),
             objects.delete: _preconditions,
             objects.download: _generation_headers,
             objects.get: _generation_headers}
  emulator.HANDLERS = tuple(
      (regex, {m: patched[h](h) if h in patched else h
               for m, h in methods.items()})
      for regex, methods in handlers)
  while _HELD:
    _HELD.pop().close()
  server = emulator.create_server('127.0.0.1', int(url.rsplit(':', 1)[1]),
                                  in_memory=True)
  server.start()
  try:
    yield url
  finally:
    server.stop()
    emulator.HANDLERS = handlers


def new_bucket(url: str) -> str:
  """An empty bucket of its own on the emulator at `url`; 'gs://<bucket>'."""
  name = f'specdec-test-{next(_BUCKETS)}'
  request = urllib.request.Request(
      url + '/storage/v1/b', data=json.dumps({'name': name}).encode(),
      headers={'Content-Type': 'application/json'}, method='POST')
  with urllib.request.urlopen(request, timeout=30) as response:
    assert response.status == 200, response.status
  return f'gs://{name}'


def object_store(address: str):
  """(tensorstore KvStore of the bucket, the object's key) of a
  gs://bucket/key address."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  bucket, key = address[len('gs://'):].split('/', 1)
  return ts.KvStore.open({'driver': 'gcs', 'bucket': bucket}).result(), key


def upload(local: os.PathLike, address: str) -> str:
  """Copies a local file or folder to a gs:// address; returns it."""
  store, key = object_store(address)
  local = pathlib.Path(local)
  files = [local] if local.is_file() else sorted(
      p for p in local.rglob('*') if p.is_file())
  for p in files:
    rel = '' if p == local else '/' + p.relative_to(local).as_posix()
    store.write(key + rel, p.read_bytes()).result()
  return address
