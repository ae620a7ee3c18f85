"""Where lark keeps the parse tables it builds from matchrec's grammars.

Building the LALR tables of match_recognize.lark takes about half a second of CPU; lark's
``cache=`` option pickles the built parser and loads it in about a tenth of that. The file
records a hash of the grammar, the options and lark's version, so an edited grammar or another
lark rebuilds it. It goes to ``__pycache__`` beside the grammars when that folder can be
written (as Python's own bytecode does), else to the user's cache folder
(``$XDG_CACHE_HOME/matchrec`` or ``~/.cache/matchrec``); ``MATCHREC_CACHE_DIR`` names the one
folder to use instead. With no writable folder the tables are built every time. A file that
cannot be read or written is ignored: lark rebuilds and carries on.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def cache_file(grammar: str) -> str | bool:
    """The ``cache=`` argument of lark.Lark for ``grammar`` (a file name in matchrec.parser)."""
    import lark

    name = f"{grammar}.lark-{lark.__version__}.py{sys.version_info[0]}{sys.version_info[1]}.cache"
    chosen = os.environ.get("MATCHREC_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folders = [Path(chosen)] if chosen else [Path(__file__).resolve().parent / "__pycache__", Path(xdg) / "matchrec"]
    for folder in folders:
        if _writable(folder):
            return str(folder / name)
    return False
