"""The documentation points at things that exist.

README.md is the entry page and docs/ holds the rest; both name scripts, gin
files, modules, notebooks and results that move as the code is restructured.
A newcomer who copies a command from them must find the file it names, and a
link must lead somewhere. So, for README.md, every docs/*.md and the READMEs
of gin_configs/, notebooks/ and tools/accelerator/:

- every relative markdown link resolves to a file or folder of the
  repository, and a `#anchor` into a markdown page names one of its headings
  (GitHub's slugs); http(s) links are not followed;
- every path a command or the text names is there: `scripts/<name>.py`,
  `gin_configs/<...>.gin`, `--gin_file=<...>.gin` (resolved against
  gin_configs/ as the jobs resolve it), a relative `<dir>/<name>.gin` in
  inline code, `notebooks/<...>.ipynb`, `specdec_jax/<...>` (modules,
  folders, assets), `tests/...`, `results/...`, `docs/...`, `tools/...`,
  `drafters/...` (package-relative), `python -m <module>`, and
  `shipped:<name>` (a folder of `specdec_jax/assets/mini/`). Brace groups
  (`{en_de,synopsis}`) are expanded; a part with a placeholder (`<task>`,
  `${t}`, `*`) is checked up to its last concrete folder; what a command
  writes (`--out`, `--out_dir`, `--export_dir`, `--work_dir`) need not
  exist yet.

There are no exceptions: a path the docs name for a module that is not
written yet fails here until it is. The finder is itself tested on
fabricated markdown (a missing `scripts/nope.py` is reported, an existing
script is not), so a finder that finds nothing cannot pass silently. Also:
docs/architecture.md names every module of the package, every docs page is
reachable from README.md or docs/README.md, no page names an issue number
or this machine's absolute paths, and README.md keeps the quick start that
CI runs, verbatim, in under 250 lines. Each fenced `python` sample
parses, and what it imports from the package, the attributes it reads off
those imports and the arguments it passes to their callables are there
(`inspect.signature`); a sample is read, not run (its models and data are
the reader's). Each flag a `python -m specdec_jax...` (or `tools...`) or
`python scripts/<name>.py` command passes (its lines joined by
backslashes too) is quoted in the source of its command's file or of what
that imports, two levels deep (where argparse's `add_argument` names it;
`--gin.NAME` is gin's).
"""

import ast
import functools
import importlib
import importlib.util
import inspect
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS_DIR = ROOT / 'docs'


def doc_files():
  """The markdown pages this test reads (README.md first)."""
  files = [ROOT / 'README.md']
  files += sorted(DOCS_DIR.glob('*.md'))
  files += [ROOT / 'gin_configs' / 'README.md', ROOT / 'notebooks' / 'README.md',
            ROOT / 'tools' / 'accelerator' / 'README.md']
  return [f for f in files if f.exists()]


def rel(path: pathlib.Path) -> str:
  return path.relative_to(ROOT).as_posix()


# ---------------------------------------------------------------- markdown


FENCE = re.compile(r'^(```|~~~).*?^\1[^\n]*$', re.S | re.M)
INLINE_CODE = re.compile(r'`[^`\n]+`')
LINK = re.compile(r'(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$', re.M)


def prose(text: str) -> str:
  """The text where links count: no fenced code blocks, no inline code (a
  code sample's `x[i](y)` is no link)."""
  text = FENCE.sub('', text)
  return INLINE_CODE.sub('', text)


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces
  as hyphens (markdown emphasis and code marks are punctuation)."""
  s = heading.strip().lower()
  s = re.sub(r'[^\w\- ]', '', s)
  return s.replace(' ', '-')


def anchors(text: str) -> set:
  """Every anchor of a page's headings (duplicates get -1, -2, ...)."""
  seen, out = {}, set()
  for match in HEADING.finditer(FENCE.sub('', text)):
    base = slug(match.group(2))
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f'{base}-{n}')
  return out


def link_problems(text: str, where: pathlib.Path):
  """Relative links of `text` (a page in folder `where`) that lead nowhere."""
  problems = []
  for target in LINK.findall(prose(text)):
    if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http(s), mailto, ...
      continue
    path, _, anchor = target.partition('#')
    dest = (where / path).resolve() if path else None
    if dest is not None and not dest.exists():
      problems.append(f'link {target}: {path} does not exist')
      continue
    if anchor:
      page = dest if dest is not None else None
      if page is None or page.suffix == '.md':
        page_text = (page.read_text(encoding='utf-8') if page is not None
                     else text)
        if anchor not in anchors(page_text):
          problems.append(f'link {target}: no heading #{anchor}')
  return problems


# ------------------------------------------------------------- named paths


ROOTED = ('scripts', 'specdec_jax', 'gin_configs', 'notebooks', 'tests',
          'results', 'docs', 'tools')
PACKAGE_RELATIVE = ('drafters', 'checkpoints', 'experiments')
OUTPUT_FLAGS = re.compile(r'--(?:out|out_dir|export_dir|work_dir)(?:=|\s+)\S+')
TOKEN = re.compile(r'[^\s`\'"()\[\]|]+')
PLACEHOLDER = set('<$*')
PATH_CHARS = r'[\w./-]'
ROOTED_PATH = re.compile(
    rf'(?<![\w./~-])((?:{"|".join(ROOTED)})/{PATH_CHARS}*)')
PACKAGE_PATH = re.compile(
    rf'(?<![\w./~-])((?:{"|".join(PACKAGE_RELATIVE)})/{PATH_CHARS}*)')
GIN_FILE = re.compile(rf'--gin_file=({PATH_CHARS}+\.gin)$')
INLINE_GIN = re.compile(rf'`({PATH_CHARS}+/{PATH_CHARS}+\.gin)`')
MODULE = r'((?:specdec_jax|tools)\b[\w.]*)'  # a module of ours, run by -m
PYTHON_M = re.compile(rf'python3?\s+-m\s+{MODULE}')
SHIPPED = re.compile(r'shipped:([\w][\w/.-]*)')


def expand_braces(token: str):
  """`a/{b,c}.gin` -> ['a/b.gin', 'a/c.gin'] (every group, recursively)."""
  match = re.search(r'\{([^{}]*,[^{}]*)\}', token)
  if not match:
    return [token]
  out = []
  for part in match.group(1).split(','):
    out += expand_braces(token[:match.start()] + part + token[match.end():])
  return out


def concrete(path: str, following: str) -> str:
  """A matched path, cut back to its last folder when a placeholder follows
  it (`results/<device>/...` -> `results/`), trailing punctuation dropped."""
  if following[:1] in PLACEHOLDER or following[:1] == '{':
    return path[:path.rfind('/') + 1]
  return path.rstrip('.,;:')


def runs(module: str) -> str:
  """The file `python -m module` runs, repository-relative (named where it
  is missing too)."""
  path = module.rstrip('.').replace('.', '/')
  return f'{path}.py' if (ROOT / f'{path}.py').exists() else (
      f'{path}/__main__.py')


def resolve_gin(name: str) -> str:
  """A `--gin_file` as the jobs resolve it: from the repository root when
  it starts with gin_configs/, else inside gin_configs/."""
  return name if name.startswith('gin_configs/') else f'gin_configs/{name}'


def named_paths(text: str) -> set:
  """Repository-relative paths that `text` names (see the module doc)."""
  found = set()
  text = OUTPUT_FLAGS.sub(' ', text)
  for token in TOKEN.findall(text):
    for item in expand_braces(token):
      gin = GIN_FILE.search(item)
      if gin:
        found.add(resolve_gin(gin.group(1)))
        continue
      for pattern, prefix in ((ROOTED_PATH, ''),
                              (PACKAGE_PATH, 'specdec_jax/')):
        for match in pattern.finditer(item):
          path = concrete(match.group(1), item[match.end():])
          if path and path.rstrip('/') not in ROOTED:
            found.add(prefix + path)
      for match in SHIPPED.finditer(item):
        name = concrete(match.group(1), item[match.end():]).rstrip('/')
        if name:
          found.add(f'specdec_jax/assets/mini/{name}')
  for match in INLINE_GIN.finditer(text):
    name = match.group(1)
    if not name.split('/')[0] in ROOTED:
      found.add(resolve_gin(name))
  for match in PYTHON_M.finditer(text):
    found.add(runs(match.group(1)))
  return found


def missing_paths(text: str):
  """The paths `text` names that the repository does not hold."""
  return sorted(p for p in named_paths(text) if not (ROOT / p).exists())


# ------------------------------------------------------ commands' flags


COMMAND = re.compile(rf'(?:{PYTHON_M.pattern}|python3?\s+(scripts/\w+\.py))'
                     r'((?:\\\n|[^\n`|;&])*)')  # lines joined by \
FLAG = re.compile(r'(?<![\w-])--([a-z][\w-]*)(?![\w.-])')  # no --gin.X


def _module_file(name: str):
  """The file `python -m name` (or an import of it) runs, or None."""
  path = ROOT / pathlib.Path(*name.split('.'))
  for file in (path.with_suffix('.py'), path / '__main__.py',
               path / '__init__.py'):
    if file.is_file():
      return file
  return None


@functools.lru_cache(maxsize=None)
def _imports(file: pathlib.Path) -> frozenset:
  """The package's files `file` imports."""
  found = set()
  for node in ast.walk(ast.parse(file.read_text(encoding='utf-8'))):
    if isinstance(node, ast.ImportFrom) and re.fullmatch(MODULE,
                                                         node.module or ''):
      found |= {_module_file(f'{node.module}.{a.name}') or
                _module_file(node.module) for a in node.names}
    elif isinstance(node, ast.Import):
      found |= {_module_file(a.name) for a in node.names
                if re.fullmatch(MODULE, a.name)}
  return frozenset(found - {None})


@functools.lru_cache(maxsize=None)
def _command_source(command: str) -> str:
  """The source of a command's file and what it imports, two levels
  deep ('' for a command that is not there: named_paths reports it)."""
  first = ROOT / (command if command.endswith('.py') else runs(command))
  if not first.is_file():
    return ''
  files = {first} | _imports(first)
  files |= {f for g in list(files) for f in _imports(g)}
  return '\n'.join(f.read_text(encoding='utf-8') for f in sorted(files))


def unknown_flags(text: str) -> list:
  """'<command> --<flag>' for each flag a `python -m specdec_jax...` (or
  `tools...`) or `python scripts/<name>.py` command of `text` passes that
  neither the command's file nor what it imports, two levels deep,
  defines (a flag's name quoted in their source: argparse's
  `add_argument('--flag'`)."""
  unknown = []
  for m in COMMAND.finditer(text):
    command = m.group(1) or m.group(2)
    source = _command_source(command)
    unknown += [f'{command} --{flag}' for flag in FLAG.findall(m.group(3))
                if source and f"'--{flag}'" not in source and
                f'"--{flag}"' not in source]
  return unknown


# ----------------------------------------------------------- code samples


PY_SAMPLE = re.compile(r'^( *)```python\n(.*?)^\1```', re.S | re.M)
_MISSING = object()


def _imported(tree: ast.AST, problems: list) -> dict:
  """{name in the sample: module or object} of its package imports; a
  module of the package it uses by its name and does not bind itself
  counts as imported (a sample continues the page's earlier ones)."""
  nodes = list(ast.walk(tree))
  bound = {n.id for n in nodes
           if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
  bound |= {a.arg for n in nodes if isinstance(n, ast.arguments)
            for a in n.posonlyargs + n.args + n.kwonlyargs +
            [n.vararg, n.kwarg] if a is not None}
  bound |= {(a.asname or a.name).split('.')[0] for n in nodes
            if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
  bound |= {n.name for n in nodes
            if isinstance(n, (ast.ExceptHandler, ast.FunctionDef,
                              ast.ClassDef)) and n.name}
  names = {}
  for node in nodes:
    if (isinstance(node, ast.Name) and node.id not in bound
        and importlib.util.find_spec(f'specdec_jax.{node.id}')):
      names[node.id] = importlib.import_module(f'specdec_jax.{node.id}')
  for node in nodes:
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split('.')[0] == 'specdec_jax':
          names[a.asname or 'specdec_jax'] = importlib.import_module(
              a.name if a.asname else 'specdec_jax')
    elif isinstance(node, ast.ImportFrom) and (
        node.module or '').split('.')[0] == 'specdec_jax':
      module = importlib.import_module(node.module)
      for a in node.names:
        obj = getattr(module, a.name, _MISSING)
        if obj is _MISSING:  # a submodule not imported by its package
          try:
            obj = importlib.import_module(f'{node.module}.{a.name}')
          except ModuleNotFoundError:
            problems.append(f'from {node.module} import {a.name}')
            continue
        names[a.asname or a.name] = obj
  return names


def sample_problems(source: str) -> list:
  """What a Python sample names of the package that is not there: an
  import, an attribute of an import, or arguments its callable refuses
  (too many positional ones, an unknown keyword)."""
  try:
    tree = ast.parse(textwrap.dedent(source))
  except SyntaxError as e:
    return [f'not Python: {e}']
  problems = []
  names = _imported(tree, problems)

  def resolve(node):
    if isinstance(node, ast.Name):
      return names.get(node.id, _MISSING)
    if isinstance(node, ast.Attribute):
      owner = resolve(node.value)
      if owner is not _MISSING and not hasattr(owner, node.attr):
        problems.append(f'{ast.unparse(node)} (no attribute {node.attr!r})')
      return getattr(owner, node.attr, _MISSING)
    return _MISSING

  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      resolve(node)
    elif isinstance(node, ast.Call) and callable(fn := resolve(node.func)):
      if any(isinstance(a, ast.Starred) for a in node.args) or any(
          k.arg is None for k in node.keywords):
        continue  # *args / **kwargs: not checkable here
      try:
        signature = inspect.signature(fn)
      except (TypeError, ValueError):  # a builtin without one
        continue
      try:
        signature.bind_partial(
            *node.args, **{k.arg: k.value for k in node.keywords})
      except TypeError as e:
        problems.append(f'{ast.unparse(node.func)}(...): {e}')
  return sorted(set(problems))


def samples(text: str) -> list:
  return [m.group(2) for m in PY_SAMPLE.finditer(text)]


# ------------------------------------------------------------------ tests


def page_id(path: pathlib.Path) -> str:
  return rel(path)


@pytest.mark.parametrize('page', doc_files(), ids=page_id)
def test_links_resolve(page):
  problems = link_problems(page.read_text(encoding='utf-8'), page.parent)
  assert not problems, f'{rel(page)}:\n' + '\n'.join(problems)


@pytest.mark.parametrize('page', doc_files(), ids=page_id)
def test_named_paths_exist(page):
  missing = missing_paths(page.read_text(encoding='utf-8'))
  assert not missing, (f'{rel(page)} names paths that do not exist:\n' +
                       '\n'.join(missing))


@pytest.mark.parametrize('page', doc_files(), ids=page_id)
def test_code_samples_name_what_the_package_has(page):
  problems = [p for s in samples(page.read_text(encoding='utf-8'))
              for p in sample_problems(s)]
  assert not problems, f'{rel(page)}:\n' + '\n'.join(problems)


def test_sample_checker_reports_what_is_missing_and_only_that():
  text = textwrap.dedent('''
      ```python
      from specdec_jax import loading, speculative, nope
      from specdec_jax import eval as eval_lib
      spec = loading.DrafterSpec(kind='t5', gama=3)
      speculative.speculative_sample(1, 2, 3, 4, 5, 6, gamma=4)
      speculative.verify_all(x)
      eval_lib.evaluate_together([], timing_repeats=3)
      loading.DataSpec(**fields)
      ```
        ```python
        import specdec_jax.drafters
        specdec_jax.drafters.T5Drafter(model, confidence=0.5)
        partitioning.Partitioner(num_partition=4)
        cache = model.init_cache(1)
        cache.nothing_checked(cache)
        ```
      ```python
      from t5x import partitioning
      partitioning.PjitPartitioner(num_partitions=1)
      import numpy as checks
      checks.zeros(3)
      try:
        pass
      except ValueError as summary:
        summary.nothing_checked()
      ```
      ''')
  found = [p for s in samples(text) for p in sample_problems(s)]
  assert found == [
      "from specdec_jax import nope",
      "loading.DrafterSpec(...): got an unexpected keyword argument 'gama'",
      "speculative.speculative_sample(...): too many positional arguments",
      "speculative.verify_all (no attribute 'verify_all')",
      "partitioning.Partitioner(...): got an unexpected keyword argument "
      "'num_partition'"], found
  assert sample_problems('x = (') == [
      "not Python: '(' was never closed (<unknown>, line 1)"]


@pytest.mark.parametrize('page', doc_files(), ids=page_id)
def test_commands_pass_flags_their_command_has(page):
  unknown = unknown_flags(page.read_text(encoding='utf-8'))
  assert not unknown, f'{rel(page)}: flags no command defines:\n' + (
      '\n'.join(unknown))


def test_flag_finder_reports_a_flag_its_command_lacks_and_only_that():
  text = textwrap.dedent('''
      python -m specdec_jax.estimates --out_dir /tmp/e --ks 1,2 \\
          --nope 3
      `python scripts/train.py --gin_file=train/train.gin --plot --gin.X=1`
      python -m specdec_jax.demo --batches 2
      ''')
  assert unknown_flags(text) == ['specdec_jax.estimates --nope',
                                 'specdec_jax.demo --batches'], (
                                     unknown_flags(text))


def test_the_pages_exist():
  for name in ('README', 'architecture', 'drafters', 'eval', 'shipped',
               'accelerator', 'mesh', 'results'):
    assert (DOCS_DIR / f'{name}.md').is_file(), name


def test_every_docs_page_is_reachable():
  """Linked from README.md or from the index, docs/README.md."""
  linked = set()
  for page in (ROOT / 'README.md', DOCS_DIR / 'README.md'):
    for target in LINK.findall(prose(page.read_text(encoding='utf-8'))):
      path = target.partition('#')[0]
      if path and not re.match(r'^[a-z][a-z0-9+.-]*:', path):
        linked.add((page.parent / path).resolve())
  pages = {p.resolve() for p in DOCS_DIR.glob('*.md')} - {
      (DOCS_DIR / 'README.md').resolve()}
  assert not pages - linked, sorted(rel(p) for p in pages - linked)


def test_architecture_names_every_module():
  """The module table is complete: every .py file of the package (but the
  package `__init__`s) by its path."""
  text = (DOCS_DIR / 'architecture.md').read_text(encoding='utf-8')
  modules = sorted(rel(p) for p in (ROOT / 'specdec_jax').rglob('*.py')
                   if p.name != '__init__.py' and '__pycache__' not in p.parts)
  assert modules
  unnamed = [m for m in modules if f'`{m}`' not in text]
  assert not unnamed, unnamed


def test_no_issue_numbers_or_machine_paths():
  for page in doc_files():
    text = page.read_text(encoding='utf-8')
    assert not re.findall(r'\bissues? #?\d+', text, re.I), rel(page)
    assert not re.findall(r'(?<![\w.~$])/(?:work|home|root|Users)/', text), (
        rel(page))


QUICK_START = '''```bash
pip install -e . && python -m specdec_jax.demo        # main job, built-in defaults
pip install -e ".[test]" && pytest                    # the test suite (CPU, 6-15 min on 2 cores)
```'''


def test_readme_is_an_entry_page_with_the_quick_start():
  text = (ROOT / 'README.md').read_text(encoding='utf-8')
  assert QUICK_START in text  # CI runs these two commands as written.
  assert len(text.splitlines()) < 250


# ------------------------------------------------ the finder finds things


FABRICATED = '''# A page

Run `python scripts/nope.py --flag` once, then:

```bash
python scripts/train.py --gin_file=train/train.gin --out results/not_yet
python -m specdec_jax.eval --gin_file=nope/missing.gin
python -m specdec_jax.nope
```

See gin_configs/shipped/{en_de,gone}.gin, `mesh/absent.gin`,
`specdec_jax/assets/mini/heads/<task>/`, `shipped:target`, `shipped:nope`,
`drafters/t5.py` and `drafters/none.py`.
'''


def test_finder_reports_what_is_missing_and_only_that():
  missing = missing_paths(FABRICATED)
  for path in ('scripts/nope.py', 'gin_configs/nope/missing.gin',
               'specdec_jax/nope/__main__.py', 'gin_configs/shipped/gone.gin',
               'gin_configs/mesh/absent.gin', 'specdec_jax/assets/mini/nope',
               'specdec_jax/drafters/none.py'):
    assert path in missing, (path, missing)
  found = named_paths(FABRICATED)
  for path in ('scripts/train.py', 'gin_configs/train/train.gin',
               'specdec_jax/eval.py', 'gin_configs/shipped/en_de.gin',
               'specdec_jax/assets/mini/target', 'specdec_jax/drafters/t5.py'):
    assert path in found and path not in missing, (path, found)
  # What a command writes is not required; a placeholder cuts the path.
  assert not any(p.startswith('results/not_yet') for p in found)
  assert 'specdec_jax/assets/mini/heads/' in found


def test_finder_reports_broken_links_and_anchors():
  text = ('# Top\n\n[a](nope.md) [b](README.md#no-such-heading) '
          '[c](https://example.com/nope) [d](#top) [e](#bottom) '
          '[f](docs/README.md)\n\n`[g](in_code.md)`\n')
  problems = link_problems(text, ROOT)
  assert any('nope.md' in p for p in problems), problems
  assert any('no-such-heading' in p for p in problems), problems
  assert any('#bottom' in p for p in problems), problems
  assert not any('example.com' in p or '#top' in p or 'docs/README' in p
                 or 'in_code' in p for p in problems), problems


def test_readme_headline_figures_are_the_results_files():
  """Each figure of the README's H100 table is its results file's value.

  Measured values come from the run's json; every predicted value is
  recomputed through `hardware.predict` on the profile read from the
  same run, so the README cannot keep a figure the files no longer give.
  """
  import json  # pylint: disable=g-import-not-at-top
  from specdec_jax import hardware  # pylint: disable=g-import-not-at-top

  profile = hardware.load(hardware.H100)
  run = json.loads((ROOT / profile.source).read_text())
  readme = (ROOT / 'README.md').read_text()

  def row(table, task, drafter):
    return next(r for r in run[table]
                if r['task'] == task and r['drafter'] == drafter)

  def pred(r):
    return hardware.predict(profile, alpha=r['alpha'], gamma=r['gamma'],
                            drafter=r['drafter'], batch=r['batch']).speedup

  floor = run['floor']
  c1 = profile.cost[1]
  en, syn = row('table2', 'en_de', 'dec2'), row('table2', 'synopsis', 'dec2')
  small = 'small@t5_1_1_small_cost'
  en_s, syn_s = row('table2', 'en_de', small), row('table2', 'synopsis', small)
  b8 = next(r for r in run['batches'] if r['batch'] == 8)
  b32 = next(r for r in run['batches'] if r['batch'] == 32)
  expected = [
      f"{floor['t1_ms']:.2f} ms vs {floor['floor_ms']:.2f} ms: "
      f"{floor['ratio']:.2f}x",
      f"{min(c1[k] for k in range(2, 10)):.2f}-"
      f"{max(c1[k] for k in range(2, 10)):.2f} / "
      f"{profile.cost[8][8]:.2f}, {profile.cost[32][8]:.2f}",
      f"{profile.c[1]['dec2']:.3f} / {profile.c[1][small]:.3f}",
      f"gamma {en['gamma']}, t = 0 | **{en['measured']:.2f}x** (predicted "
      f"{pred(en):.2f}; alpha {en['alpha']:.2f})",
      f"gamma {syn['gamma']}, t = 0 | {syn['measured']:.2f}x (predicted "
      f"{pred(syn):.2f})",
      f"{en_s['measured']:.2f}x / {syn_s['measured']:.2f}x (predicted "
      f"{pred(en_s):.2f} / {pred(syn_s):.2f})",
      f"{b8['measured']:.2f}x / {b32['measured']:.2f}x "
      f"({b8['measured'] / pred(b8):.2f} / "
      f"{b32['measured'] / pred(b32):.2f} of predicted",
  ]
  missing = [e for e in expected if e not in readme]
  assert not missing, missing
