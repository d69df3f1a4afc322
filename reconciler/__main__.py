"""``python -m reconciler``: the same entry point as the ``vgpuctl`` console script."""

from reconciler.cli.main import main

raise SystemExit(main())
