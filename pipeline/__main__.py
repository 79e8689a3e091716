"""`python -m grpo_pipeline.pipeline` is the same as the `grpo` console script."""

from grpo_pipeline.pipeline.cli import main

raise SystemExit(main())
