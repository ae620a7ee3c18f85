"""A relocatable Python environment with matchrec, packed for Spark's ``spark.archives``.

``matchrec spark-env OUT.tar.gz`` (or ``build(path)``) writes a gzip'd tar holding this
interpreter (binary, shared library, standard library) and the installed files of matchrec and
of what its Spark executors import (duckdb, pyarrow, numpy, numba, pandas, ...). Spark unpacks
it in each executor's working directory; executors then start ``bin/matchrec-python``, a shell
launcher that finds the interpreter next to itself, so the archive runs wherever it is unpacked
on a machine of the same platform (no Python or matchrec needed on the workers). ``ship()`` in
``matchrec.spark`` sets the session up to use it.

The launcher is named ``matchrec-python`` and found through ``PATH`` (relative on executors,
a link to the driver's interpreter on the driver) because Spark starts every Python worker -
those of the executors and the driver-side ones that analyse table functions - with one
interpreter path: a path relative to the unpacked archive exists only on executors.
"""
from __future__ import annotations

import io
import os
import re
import sys
import sysconfig
import tarfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from matchrec import errors as E

LAUNCHER = "matchrec-python"
# What executors import besides matchrec's own requirements: pyspark's Arrow paths need pandas.
EXTRA = ("pandas",)
# pyspark itself comes from the worker's Spark installation (pyspark.zip on the worker's path).
SKIP = {"pyspark", "py4j", "pip", "setuptools", "wheel"}
# Parts of the standard library no executor imports.
STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
               "__pycache__"}
RUNTIME = ("duckdb", "pyarrow", "sqlglot", "lark", "numpy", "numba")


@dataclass
class Built:
    path: Path
    bytes: int
    files: int
    seconds: float
    distributions: list[str]


def _launcher(version: str) -> str:
    return f"""#!/bin/sh
# the interpreter of the unpacked archive, wherever it was unpacked
here=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$here/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" PYTHONHOME="$here" \\
NUMBA_CACHE_DIR="${{NUMBA_CACHE_DIR:-${{TMPDIR:-/tmp}}/matchrec-numba}}" \\
exec "$here/bin/python{version}" "$@"
"""


def _requirement_names(dist) -> list[str]:
    out = []
    for req in dist.requires or []:
        if ";" in req and "extra" in req.split(";", 1)[1]:
            continue  # optional extras are not needed at run time
        name = re.match(r"\s*([A-Za-z0-9_.\-]+)", req)
        if name:
            out.append(name.group(1))
    return out


def distributions() -> list:
    """The installed distributions executors need: matchrec's runtime requirements, pandas and
    everything they require, without pyspark (the workers' Spark brings it)."""
    try:
        roots = _requirement_names(metadata.distribution("matchrec"))
    except metadata.PackageNotFoundError:  # run from a source tree
        roots = list(RUNTIME)
    todo, seen, found = roots + list(EXTRA), set(), []
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen or key in SKIP:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise E.OperationalError(f"{name} is not installed in this Python ({sys.executable}); "
                                     "install matchrec with its dependencies first") from None
        found.append(dist)
        todo += _requirement_names(dist)
    return found


def version() -> str:
    """matchrec's version: the package's own (it is loaded already, this module being part of it)."""
    return getattr(sys.modules.get(__package__), "__version__", None) or metadata.version("matchrec")


def _matchrec_files():
    root = Path(__file__).resolve().parent  # the package this module belongs to
    for path in root.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path, Path("matchrec") / path.relative_to(root)


def build(out: str | os.PathLike, compresslevel: int = 6) -> Built:
    """Write the archive to ``out``; returns its size, file count and build time."""
    started = time.perf_counter()
    out = Path(out)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(sys.base_prefix)
    binary = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths(vars={"installed_base": str(base), "base": str(base)})["stdlib"])
    site = f"lib/python{version}/site-packages"
    dists = distributions()
    count = 0
    tmp = out.with_name(out.name + ".part")
    with tarfile.open(tmp, "w:gz", compresslevel=compresslevel) as tar:
        def add(src: Path, name: str):
            nonlocal count
            tar.add(str(src), arcname=name, recursive=False)
            count += 1

        add(binary, f"bin/python{version}")
        launcher = _launcher(version).encode()
        info = tarfile.TarInfo(f"bin/{LAUNCHER}")
        info.size, info.mode, info.mtime = len(launcher), 0o755, int(time.time())
        tar.addfile(info, io.BytesIO(launcher))
        libdir = Path(sysconfig.get_config_var("LIBDIR") or base / "lib")
        for lib in libdir.glob(f"libpython{version}*.so*"):
            add(Path(os.path.realpath(lib)), f"lib/{lib.name}")
        for path in sorted(stdlib.rglob("*")):
            rel = path.relative_to(stdlib)
            if set(rel.parts) & STDLIB_SKIP or rel.parts[0].startswith("config-") or not path.is_file() \
                    or path.suffix == ".pyc":  # config-*: the static library and makefile of builds
                continue
            add(path, f"lib/python{version}/{rel.as_posix()}")
        for src, rel in _matchrec_files():
            add(src, f"{site}/{rel.as_posix()}")
        for dist in dists:
            for f in dist.files or []:
                if "__pycache__" in f.parts or f.parts[0] == ".." or f.suffix == ".pyc":
                    continue  # scripts installed outside site-packages are not needed
                src = Path(dist.locate_file(f))
                if src.is_file():
                    add(src, f"{site}/{f.as_posix()}")
    tmp.replace(out)
    return Built(out, out.stat().st_size, count, time.perf_counter() - started,
                 sorted(f"{d.metadata['Name']}=={d.version}" for d in dists))


# ------------------------------------------------------------------ the command
def add_arguments(parser) -> None:
    parser.add_argument("out", help="the archive to write, e.g. matchrec-env.tar.gz")
    parser.add_argument("--fast", action="store_true", help="compress less (faster, larger archive)")


def run(args) -> int:
    built = build(args.out, compresslevel=1 if args.fast else 6)
    print(f"wrote {built.path}: {built.bytes / 2**20:.1f} MiB, {built.files} files, {built.seconds:.1f} s")
    print("distributions: " + ", ".join(built.distributions))
    print(f"use it with matchrec.spark.ship(builder, {str(built.path)!r})")
    return 0
