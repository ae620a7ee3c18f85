"""Build backend: setuptools', plus filling numba's cache when an editable install is built.

``pip install -e .`` builds the editable wheel in an isolated environment; for that build alone
this backend asks for numba and numpy too (the same ranges as the package's dependencies, so pip
resolves the same versions it then installs) and compiles the compiled matcher's kernels there
(matchrec.operators.compiled.precompile). numba writes them to ``__pycache__`` beside
matchrec/operators in the source tree, where the installed package reads them: the first
MATCH_RECOGNIZE after the install loads them instead of spending several seconds of CPU per
kernel compiling. Anything going wrong here only leaves the cache empty (the first query then
compiles, as without this step); it never fails the install. MATCHREC_NO_PRECOMPILE=1 skips it.
Regular wheels and sdists are built by setuptools alone.
"""
from __future__ import annotations

import os
import subprocess
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools' own

KERNEL_REQUIRES = ["numba>=0.61.0,<0.69", "numpy>=1.26.4,<3"]  # as in pyproject.toml's dependencies
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_requires_for_build_editable(config_settings=None):
    return list(_setuptools.get_requires_for_build_editable(config_settings)) + KERNEL_REQUIRES


def _precompile() -> None:
    if os.environ.get("MATCHREC_NO_PRECOMPILE"):
        return
    print("matchrec: compiling the matcher's kernels into numba's cache (once per install)", file=sys.stderr)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        subprocess.run([sys.executable, "-c", "from matchrec.operators import compiled; compiled.precompile()"],
                       cwd=ROOT, env=env, timeout=1800, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        print(f"matchrec: the kernels were not compiled ({err}); the first query will compile them",
              file=sys.stderr)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _precompile()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
