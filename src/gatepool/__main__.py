"""``python -m gatepool`` is the ``gatepool`` command."""

from gatepool.cli import main

raise SystemExit(main())
