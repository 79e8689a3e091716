"""One rank of the 2-process CPU data-parallel test (launched by tests/test_ddp.py through torchrun).

It trains through the pipeline's own API and, at the end, writes this rank's trainable weights to
OUT/rank<R>.safetensors so the test can compare the ranks.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import TrainerCallback  # noqa: E402

from pipeline.train import run_training  # noqa: E402
from train_helpers import demo_config  # noqa: E402


class DumpTrainableWeights(TrainerCallback):
    def __init__(self, out: Path):
        self.out = out

    def on_train_end(self, args, state, control, model=None, **kwargs):
        from safetensors.torch import save_file

        weights = {name: p.detach().clone().contiguous() for name, p in model.named_parameters() if p.requires_grad}
        save_file(weights, str(self.out / f"rank{os.environ['RANK']}.safetensors"))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    failing = sys.argv[2:] == ["reward-fails-on-process-1"]
    rewards = ["correctness", "train_helpers:digit_share_reward"] + (["train_helpers:fails_on_process_1"] if failing
                                                                     else [])
    cfg = demo_config(out / "run", max_steps=3 if failing else 2, save_steps=100, num_generations=4,
                      per_device_train_batch_size=4, reward_funcs=rewards, learning_rate=1e-2, resume="never")
    result = run_training(cfg, callbacks=[DumpTrainableWeights(out)])
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: {result.status} after {result.steps} steps")
