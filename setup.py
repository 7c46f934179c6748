"""specdec_jax: exact speculative decoding for T5X encoder-decoder checkpoints."""

import setuptools

setuptools.setup(
    name='specdec_jax',
    version='0.1.0',
    description=(
        'Exact speculative decoding (Leviathan et al. 2023) for T5X T5 '
        'checkpoints in JAX/Flax.'
    ),
    # Not tools/ (a budgeted run on a borrowed accelerator): it runs from
    # the repository root, `python -m tools.accelerator.stored`.
    packages=setuptools.find_packages(include=['specdec_jax', 'specdec_jax.*']),
    # The shipped mini models and test slices (specdec_jax/shipped.py).
    package_data={'specdec_jax': ['assets/mini/*', 'assets/mini/**/*',
                                  'bench/chips.json',
                                  'profiles/*.json',
                                  'profiles/iterations/*.json']},
    include_package_data=True,
    python_requires='>=3.10',
    install_requires=[
        'jax>=0.4.30',
        'flax>=0.8',
        'optax',
        'orbax-checkpoint',
        'tensorstore',
        'seqio',
        'gin-config',
        'sentencepiece',
        'sacrebleu',
        'rouge-score',
        'tqdm',
        'matplotlib',
        'numpy',
    ],
    extras_require={
        'test': [
            'pytest',
            # Two workers (pytest.ini): XLA compiles on one core each.
            'pytest-xdist',
            # The layering contracts (.importlinter, tests/test_layering.py).
            'import-linter',
            'scipy',
            # The independent reference implementation (CPU build on disk).
            'torch==2.13.0',
            'transformers',
            'nbclient',
            'nbformat',
            'ipykernel',
            # gs:// checkpoints against a GCS on the test machine
            # (tests/fake_gcs.py patches this version's object listing);
            # gcsfs carries orbax's gs:// metadata reads there.
            'gcp-storage-emulator==2026.7.19',
            'gcsfs',
            # libtpu at the installed jax's pin: tests/test_compile_only.py
            # compiles for compile-only TPU devices (the suite still runs
            # on the CPU; specdec_jax.compiled, docs/tpu.md).
            'jax[tpu]',
        ],
    },
)
