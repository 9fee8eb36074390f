"""``python -m ablations.report``: see :mod:`ablations.report`."""

from .cli import main

raise SystemExit(main())
