"""`python -m pipeline` is the same as the `grpo` console script."""

from pipeline.cli import main

raise SystemExit(main())
