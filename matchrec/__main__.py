"""``python -m matchrec``: the same command line as the ``matchrec`` console script."""
from matchrec.cli import main

raise SystemExit(main())
