"""`python -m hpo` runs the `hpo` command."""

from hpo.cli import main

raise SystemExit(main())
