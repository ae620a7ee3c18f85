"""Start-up: what ``import matchrec`` loads, and that a second process reuses the compiled kernels
and the parser tables the first one cached. Each check runs in a new interpreter; none times
anything."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("pyspark", "numba", "llvmlite", "pyarrow.flight", "altair", "vl_convert", "sqlalchemy", "pandas",
         "polars")


def _python(code: str, **env) -> str:
    full_env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_import_loads_no_heavy_module():
    loaded = json.loads(_python(f"""
        import json, sys
        import matchrec
        print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
    """))
    assert loaded == []


def test_exported_names_resolve_lazily():
    out = json.loads(_python("""
        import json, sys
        import matchrec
        from matchrec import connect, Cursor, ProgrammingError
        import matchrec.dbapi as dbapi
        names = [n for n in matchrec.__all__ if getattr(matchrec, n) is not getattr(dbapi, n, getattr(matchrec, n))]
        con = matchrec.connect()
        cur = con.cursor()
        cur.execute("SELECT 42")
        print(json.dumps({"mismatched": names, "row": cur.fetchall()[0][0], "connect": connect is dbapi.connect,
                          "error": issubclass(ProgrammingError, matchrec.Error), "cursor": Cursor is dbapi.Cursor,
                          "apilevel": matchrec.apilevel, "sub": type(matchrec.engine).__name__,
                          "all": sorted(set(matchrec.__all__) - set(dir(matchrec)))}))
    """))
    assert out == {"mismatched": [], "row": 42, "connect": True, "error": True, "cursor": True, "apilevel": "2.0",
                   "sub": "module", "all": []}


_QUERIES = """
    import json, sys
    import matchrec
    from matchrec import demo
    from matchrec.operators import compiled, kernels, vm
    warm = sys.argv[1] == "warm"
    if warm:
        matchrec.warm(wait=True)  # the parser and the two kernels without DEFINE programs
    before = len(vm.run_partitions.signatures)
    con = matchrec.connect()
    demo.load(con, demo.generate(2000, 7))
    cur = con.cursor()
    counts = []
    for sql in (demo.VSHAPE_SQL, demo.CRIMES_SQL):
        cur.execute(sql)
        counts.append(len(cur.fetchall()))
    known = {tuple(sig) for _, _, sig in compiled.kernels(full=True)}
    stats = {name: {"hits": sum(d.stats.cache_hits.values()), "misses": sum(d.stats.cache_misses.values())}
             for name, d in (("run", vm.run_partitions), ("extents", kernels.label_extents))}
    print(json.dumps({"counts": counts, "stats": stats, "built": compiled.built(),
                      "added_by_queries": len(vm.run_partitions.signatures) - before,
                      "unknown": [str(s) for s in vm.run_partitions.signatures if tuple(s) not in known]}))
"""


def test_second_process_loads_cached_kernels(tmp_path):
    env = {"MATCHREC_CACHE_DIR": str(tmp_path / "matchrec")}
    first = json.loads(_python(_QUERIES.replace("sys.argv[1]", "'cold'"), **env))
    # the engine calls the kernels with exactly the signatures compiled.kernels() lists (so warm()
    # builds what queries use), whatever the first process found in numba's cache
    assert first["unknown"] == []
    assert first["counts"][0] > 0 and first["counts"][1] >= 0
    second = json.loads(_python(_QUERIES.replace("sys.argv[1]", "'warm'"), **env))
    assert second["counts"] == first["counts"]
    assert second["built"] == ["parser", "label_extents", "run_partitions", "run_partitions+conds"]
    # everything came from the cache the first process left: nothing compiled, nothing added
    assert second["stats"]["run"] == {"hits": 2, "misses": 0}
    assert second["stats"]["extents"]["misses"] == 0 and second["stats"]["extents"]["hits"] == 1
    assert second["added_by_queries"] == 0 and second["unknown"] == []


def test_parser_tables_cached_once(tmp_path):
    folder = tmp_path / "cache"
    code = """
        import os, matchrec
        cur = matchrec.connect().cursor()
        cur.execute("SELECT * FROM (VALUES (1, 1)) t(k, v) MATCH_RECOGNIZE (ORDER BY k ALL ROWS PER MATCH "
                    "PATTERN (A) DEFINE A AS v > 0)")
        print(sorted(os.listdir(os.environ["MATCHREC_CACHE_DIR"])))
    """
    listed = _python(code, MATCHREC_CACHE_DIR=str(folder))
    assert "match_recognize.lark" in listed
    [cached] = list(folder.iterdir())
    stamp = cached.stat().st_mtime_ns
    _python(code, MATCHREC_CACHE_DIR=str(folder))
    assert cached.stat().st_mtime_ns == stamp  # read, not rebuilt and written again


def test_unwritable_cache_folder_falls_back(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = _python("""
        import matchrec
        cur = matchrec.connect().cursor()
        cur.execute("SELECT * FROM (VALUES (1, 1)) t(k, v) MATCH_RECOGNIZE (ORDER BY k ALL ROWS PER MATCH "
                    "PATTERN (A) DEFINE A AS v > 0)")
        print(len(cur.fetchall()))
    """, MATCHREC_CACHE_DIR=str(blocker / "below"))
    assert out == "1"


def test_editable_build_asks_for_the_kernel_dependencies():
    """The editable build compiles the kernels with the numba and numpy the package depends on:
    the backend's extra requirements must stay the ranges of pyproject.toml's dependencies."""
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("matchrec_build", os.path.join(ROOT, "buildtools",
                                                                                   "matchrec_build.py"))
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert project["build-system"]["build-backend"] == "matchrec_build"
    deps = {d.split(">")[0].split("=")[0].split("<")[0]: d for d in project["project"]["dependencies"]}
    assert backend.KERNEL_REQUIRES == [deps["numba"], deps["numpy"]]
