"""The wrapped TRL GRPOTrainer and the SFT format warm-up that runs before it."""
