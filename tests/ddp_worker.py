"""One rank of the data-parallel CPU tests (tests/test_ddp.py): launched by torchrun on one machine, or by
`accelerate launch --config_file configs/accelerate/cpu_2machines.yaml --machine_rank R` as one of two "machines".

    ddp_worker.py OUT [reward-fails-on-process-1 | hang-after-checkpoint | resume]

It trains through the pipeline's own API, records the prompts it scored at each step (train_helpers.record_seen,
into OUT/seen-rank<R>.jsonl), and every write it makes under the run folder OUT/run (a Python audit hook: open for
writing, mkdir, rename, remove; into OUT/writes-rank<R>-<mode>.json). At the end it writes this rank's trainable weights to
OUT/rank<R>.safetensors. `hang-after-checkpoint` trains 3 steps but stops after checkpoint-2 is saved and waits to be
killed; `resume` then trains the same 3 steps with --resume auto.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import TrainerCallback  # noqa: E402

from grpo_pipeline.pipeline.run.nodes import leave_process_group  # noqa: E402
from grpo_pipeline.pipeline.train import run_training  # noqa: E402
from train_helpers import PRODUCT_REWARD_TIMEOUT, demo_config, freeze_the_training_stack  # noqa: E402

WRITES: list[str] = []
MODE = sys.argv[2] if len(sys.argv) > 2 else "run"


def audit_writes(run_dir: Path) -> None:
    """Record (relative to run_dir) every path under it this process opens for writing, creates, renames or removes."""
    root = str(run_dir)

    def hook(event, args):
        if event == "open":
            path, mode = args[0], args[1] or "r"
            if not isinstance(path, (str, bytes, os.PathLike)) or not any(c in str(mode) for c in "wax+"):
                return
            paths = [path]
        elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree"):
            paths = [a for a in args if isinstance(a, (str, os.PathLike))]
        else:
            return
        for path in paths:
            text = os.fsdecode(path) if not isinstance(path, os.PathLike) else os.fspath(path)
            if text.startswith(root) and text != root:
                WRITES.append(os.path.relpath(text, root))

    sys.addaudithook(hook)


def dump_writes(out: Path) -> None:
    (out / f"writes-rank{os.environ['RANK']}-{MODE}.json").write_text(json.dumps(sorted(set(WRITES))))


class DumpTrainableWeights(TrainerCallback):
    def __init__(self, out: Path):
        self.out = out

    def on_train_end(self, args, state, control, model=None, **kwargs):
        from safetensors.torch import save_file

        weights = {name: p.detach().clone().contiguous() for name, p in model.named_parameters() if p.requires_grad}
        save_file(weights, str(self.out / f"rank{os.environ['RANK']}.safetensors"))
        dump_writes(self.out)


class WaitToBeKilled(TrainerCallback):
    """After checkpoint-`step` is saved: say so, then wait for the test's SIGKILL (a crash mid-run)."""

    def __init__(self, out: Path, step: int):
        self.out, self.step = out, step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            dump_writes(self.out)
            print(f"rank {os.environ['RANK']}: checkpoint-{self.step} saved, waiting to be killed (pid {os.getpid()})",
                  flush=True)
            time.sleep(600)


if __name__ == "__main__":
    # As the tests' own processes do (tests/conftest.py): the stack's ~800k module-level objects into the permanent
    # generation, so neither the full collections a run starts (Trainer.train, a tokenizer load: ~0.5 s each, three
    # a rank) nor the interpreter's exit (2-3 s of collecting them again) walk them. The run itself is unchanged.
    freeze_the_training_stack()
    out = Path(sys.argv[1])
    mode = MODE
    os.environ["GRPO_SEEN_DIR"] = str(out)
    audit_writes(out / "run")
    failing = mode == "reward-fails-on-process-1"
    rewards = ["correctness", "train_helpers:record_seen"] + (["train_helpers:fails_on_process_1"] if failing else [])
    callbacks = [DumpTrainableWeights(out)] + ([WaitToBeKilled(out, 2)] if mode == "hang-after-checkpoint" else [])
    cfg = demo_config(out / "run", max_steps=3, save_steps=100 if failing else 2, num_generations=4,
                      per_device_train_batch_size=4, reward_funcs=rewards, learning_rate=1e-2,
                      reward_timeout=PRODUCT_REWARD_TIMEOUT,  # each rank forks its rewards' processes, as users' do
                      resume="auto" if mode == "resume" else "never",
                      # the format warm-up too (every process trains it; one writes warmup/, a resume reuses it)
                      sft_warmup_steps=0 if failing else 2,
                      # and the evals before and after, on a few held-out problems (the main process measures them)
                      eval_before=not failing, eval_after=not failing, eval_limit=4)
    result = run_training(cfg, callbacks=callbacks)
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: {result.status} after {result.steps} steps")
    leave_process_group()  # as `grpo` does when its command returns (pipeline/cli.py)
