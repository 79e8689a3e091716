"""The GPU check: the product's own path first, on a real GPU, in one run of 8 minutes; a JSON report and a log.

What it runs, each recorded as pass / fail / skipped with its error tail, the run carrying on after a
failure, in this order (STEPS), each step within its own share of the 480 s budget (STEP_CAPS, which add up
to it, so a slow benchmark can never cut the Unsloth chain):

1. image    the versions of the packages the kit takes from the machine's image instead of carrying them
            (peft, accelerate, pyarrow, fsspec, huggingface-hub, transformers, torch, ...; wheels.py
            image_requirements: the ranges from env/known_good.toml and the carried wheels' Requires-Dist),
            naming any outside its range.
2. env      `grpo env --json` on the machine (versions, GPU, driver).
3. models   random-weight models with the bundled Qwen2.5 tokenizer, built from Qwen2Config values
            written below as data (nothing is downloaded): the Qwen2.5-0.5B-Instruct and -1.5B shapes.
4. chain    with vLLM installed (the parts mode), first the Unsloth chain with fast_inference: true on the 0.5B
            shape: train with vLLM rollouts (counted at vllm.LLM.generate) and the stale-rollout probe against
            the engine at every step, resume, `grpo generate` with the base model and then through
            `fast_generate` with the adapter's LoRARequest (load_lora), export; each sub-step in a process of
            its own, since nothing releases a vLLM engine inside a process. Then
            per backend (unsloth with fast_inference: false first, the product's path, then plain), per
            model (the tiny test model `tiny-qwen2.5` and the 0.5B shape), per precision (bf16 LoRA, 4-bit
            NF4 QLoRA through bitsandbytes), with gradient checkpointing and the real rewards:
            SFT warm-up + train 2 GRPO steps (a checkpoint each) -> resume from checkpoint-2 to step 3 -> lora/
            -> `grpo generate --lora` greedy, which must differ from `grpo generate --base` (the adapter is
            applied) -> `grpo export --to merged16`, whose merged model is loaded and generates.
5. bench    plain vs unsloth (and, with vLLM installed, Unsloth + vLLM: fast_inference true), same config,
            4-bit QLoRA, on the 0.5B and 1.5B shapes: median GRPO step time, rollout tokens/s and peak VRAM
            (with vLLM also the card's memory in use and the gpu_memory_utilization given), with completions
            forced to full length (`min_new_tokens` = max_completion_length in TRL's generation config, and
            vLLM's `min_tokens` through vllm_sampling_params, so random weights cannot stop early and every
            backend generates the same number of tokens), and the ratios.

The anchor for the benchmark is Unsloth's published claim for GRPO: about 90% less VRAM than
Hugging Face TRL with Flash Attention 2 (unsloth.ai/blog/grpo, 2025-02-20: Llama 3.1 8B, 20K context,
8 generations: 54.3 GB vs 510.8 GB). That figure includes Unsloth's vLLM path and long contexts; this
check has short completions, and vLLM only in the parts mode.

What a lent machine can and cannot prove. In one call with the wheel set of .gpu-wheels it proves, on a real GPU,
what this kit runs without vLLM: Unsloth's LoRA and 4-bit QLoRA training with `fast_inference: false`, resuming,
`grpo generate` with the trained adapter (its greedy output differs from the base model's), `grpo export` (the
merged model loads and generates), the plain backend the same way, the benchmark, and that the image's packages
lie inside the ranges the kit needs. In the parts mode (the set with vLLM, carried in parts of at most 55 MiB) it
also runs `fast_inference: true` on vLLM 0.26.0, the release that pins the machine's own torch 2.11 and links its
CUDA 13: rollouts from the real engine, the stale-rollout probe against it, resume, `grpo generate` through
`model.fast_generate` with `model.load_lora`, export, and the benchmark's Unsloth + vLLM row. That proves Unsloth's
vLLM path and the pipeline's use of it on vLLM 0.26.0, not on the pinned 0.31.0: its 320 MB wheel pins torch 2.13,
which the machine (64 MiB a call, torch 2.11) can neither carry nor run. Where 0.26.0 and 0.31.0 differ (docs/gpu.md,
GPU check), and for standby (sleep/wake), the pinned path stays covered by the contract tests only
(tests/test_unsloth_*.py: strict doubles bound to the pinned wheels' real signatures).

Each backend runs in its own child process (Unsloth patches trl/transformers/peft at import, so a plain
measurement must never share a process with it); a child that dies is restarted for the cases it had
not reached. `--dry-run` runs the same plumbing on CPU with the tiny model and one step (the tests do).
This file is the driver (options, time budget, children, report); what a child runs is in cases.py
(the models, the chain) and benchmark.py (the benchmark); the steps and their shares of the budget are
check_steps.py, the report's rows and table check_report.py.

On a lent GPU machine, from the repository root here: build the wheel set first
(`python scripts/gpu_check/wheels.py build`), then call the device tool's `run` with
carry [".gpu-wheels"], timeout_s 560 and this command:

    set -o pipefail; export PYTHONUNBUFFERED=1; python3 scripts/gpu_check/wheels.py install --target /tmp/site > $OUT/install.log 2>&1 || { tail -20 $OUT/install.log; exit 3; }; PYTHONPATH=/tmp/site python3 scripts/gpu_check/run_check.py --out $OUT --budget-s 480 2>&1 | tee $OUT/console.log

Then copy $OUT/gpu-report.json to docs/gpu-reports/<date>-<gpu>.json and commit it
(docs/gpu-reports/README.md). A rerun of some steps or units only, sharing the whole budget: add e.g.
`--only chain/unsloth/qwen2.5-0.5b/nf4,bench-unsloth`. The parts mode (vLLM) is a sequence of calls that
`python scripts/gpu_check/parts.py split` prints (scripts/gpu_check/parts.py, docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from checkout import checkout_site  # beside this file: sys.path[0] as a script
from typing import Any, Optional

# The cases run in the children live beside this driver (this folder is sys.path[0] when it runs as a script).
from benchmark import child_bench
from cases import (VLLM_LABEL, Recorder, child_models, freeze_dry_run_imports, has_cuda, skip_reason, tail,
                   unit_steps)
from chain_case import child_chain
from check_report import ANCHOR, bench_rows, gpu_info, package_versions, print_table
from check_steps import DRY_RUN_CAP_S, PROCESS_PER_UNIT, STEPS, STEP_CAPS, VLLM_STEPS, step_units, vllm_installed
from gpu_image import check_image, image_requirements, installed_versions
from vllm_set import VLLM_VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]
REPORT_NAME = "gpu-report.json"
LOG_NAME = "gpu-check.log"

# The paragraph of the docstring above (and of docs/gpu.md) that says what a lent machine can and cannot prove.
PROVES = " ".join(__doc__.split("What a lent machine can and cannot prove.", 1)[1].split("\n\n", 1)[0].split())
PROVES = "What a lent machine can and cannot prove. " + PROVES
NOT_COVERED = ("vLLM is not run by this check: fast_inference: true, model.fast_generate and model.load_lora are "
               "covered by the contract tests only. " + PROVES)
NOT_COVERED_WITH_VLLM = ("vLLM {version} ran, not the pinned 0.31.0: what differs between them is covered by the "
                         "contract tests only. " + PROVES)

BUDGET_S = 480  # the device command's --budget-s


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.chosen = chosen_steps(args.only, args.dry_run)
        # The steps that share the budget: a vLLM step is skipped at once where vllm is missing, so it takes no share.
        self.planned = [step for step in self.chosen if step not in VLLM_STEPS or vllm_installed()]
        self.deadline = time.time() + args.budget_s
        self.records: list[dict[str, Any]] = []
        self.log_path = args.out / LOG_NAME
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout_site()), str(REPO_ROOT),
                                                                                os.environ.get("PYTHONPATH")])),
                    "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
                    "GRPO_CACHE_DIR": str(args.work / "cache"),
                    # Unsloth fetches a README from the hub for usage statistics unless told not to.
                    "UNSLOTH_DISABLE_STATISTICS": "1"}

    def _dry_run_skip(self, unit: str) -> bool:
        """Record a unit that cannot run here as skipped instead of starting a child for it: in a dry run one that
        needs CUDA, anywhere one that needs vllm where it is not installed."""
        if self.args.dry_run:
            reason = skip_reason(unit, cuda=False, dry_run=True)
        elif unit.split("/")[1:2] == [VLLM_LABEL] and not vllm_installed():
            reason = skip_reason(unit, cuda=True, dry_run=False, vllm=False)
        else:
            reason = None
        if reason is None:
            return False
        for step in unit_steps(unit):
            self.skip(step, reason)
        return True

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")

    def skip(self, step: str, reason: str) -> None:
        self.records.append({"step": step, "status": "skipped", "seconds": 0.0, "error": reason})
        print(f"[gpu-check] {step}: skipped - {reason}", flush=True)

    def cap(self, step: str) -> float:
        """The step's share of the budget: the whole budget shared among the steps planned (chosen, and possible
        here) in STEP_CAPS' proportions (a rerun of one step with --only may take all of it)."""
        if self.args.dry_run:
            return DRY_RUN_CAP_S
        planned = self.planned if step in self.planned else [*self.planned, step]
        return self.args.budget_s * STEP_CAPS[step] / sum(STEP_CAPS[s] for s in planned)

    def image_step(self) -> None:
        """The image's packages against the ranges the kit needs (wheels.py); in a dry run this machine is not
        the image, so what lies outside is recorded without failing the step."""
        start = time.time()
        # With the parts mode's vLLM installed, its Requires-Dist on the image's packages count too (torch==2.11.0).
        needs = image_requirements(vllm=installed_versions(["vllm"])["vllm"] == VLLM_VERSION)
        found = check_image(installed_versions(needs), needs)
        failed = bool(found["outside"]) and not self.args.dry_run
        record = {"step": "image", "status": "fail" if failed else "pass", "seconds": time.time() - start,
                  "detail": found}
        if found["outside"]:
            record["error"] = "outside the kit's ranges: " + "; ".join(f"{k} {v}" for k, v in found["outside"].items())
        self.records.append(record)
        print(f"[gpu-check] image: {record['status']} ({len(found['packages'])} packages, "
              f"{len(found['outside'])} outside their ranges: {', '.join(found['outside']) or 'none'})", flush=True)

    def env_step(self) -> None:
        start = time.time()
        done = subprocess.run([sys.executable, "-m", "grpo_pipeline.pipeline", "env", "--json"], cwd=REPO_ROOT, env=self.env,
                              capture_output=True, text=True, timeout=max(5, min(self.cap("env"), self.left())))
        self.log(f"== grpo env --json (exit {done.returncode})\n{done.stdout}\n{done.stderr}")
        record: dict[str, Any] = {"step": "env", "seconds": time.time() - start, "exit_code": done.returncode}
        try:
            record["detail"] = json.loads(done.stdout)
            # `grpo env` exits 1 when versions drift from the matrix (the GPU machine's torch is 2.11, not
            # 2.13.0): that is its report, not a failure of the check; only an unreadable report fails.
            record["status"] = "pass"
        except json.JSONDecodeError:
            record.update(status="fail", error=tail(done.stdout + done.stderr))
        self.records.append(record)
        print(f"[gpu-check] env: {record['status']} (grpo env exit {done.returncode})", flush=True)

    def child(self, step: str, extra: list[str], units: list[str]) -> None:
        """Run a child until every unit has records, restarting it for the units a crash left undone; for a step in
        PROCESS_PER_UNIT, a child per unit."""
        todo = [unit for unit in units if not self._dry_run_skip(unit)]
        step_deadline = time.time() + self.cap(step)  # restarts (and the children of one step) share its one cap
        for batch in ([[unit] for unit in todo] if step in PROCESS_PER_UNIT else [todo]):
            self._children(step, extra, batch, step_deadline)

    def _children(self, step: str, extra: list[str], todo: list[str], step_deadline: float) -> None:
        results = self.args.work / f"{step}.jsonl"
        while todo:
            timeout = min(step_deadline, self.deadline) - time.time()
            if timeout < 15:
                for unit in todo:
                    self.skip(f"{step}:{unit}", f"out of the time budget ({self.args.budget_s:.0f} s)")
                return
            results.unlink(missing_ok=True)
            command = [sys.executable, str(Path(__file__).resolve()), "--child", step, "--work", str(self.args.work),
                       "--results", str(results), "--units", ",".join(todo)] + extra
            if self.args.dry_run:
                command.append("--dry-run")
            self.log(f"== {step}: {' '.join(command)}")
            start = time.time()
            with open(self.log_path, "a", encoding="utf-8") as log:
                try:
                    done = subprocess.run(command, cwd=self.args.work, env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT, timeout=timeout)
                    exit_code = done.returncode
                except subprocess.TimeoutExpired:
                    exit_code = None
            lines = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            finished = [line for line in lines if "status" in line]
            self.records.extend(finished)
            started = [line["start"] for line in lines if "start" in line]
            done_units = {unit for unit in todo if any(r["step"].startswith(unit) for r in finished)}
            if exit_code == 0:
                return
            # The child died (or ran out of time) inside the last unit it started.
            crashed = started[-1] if started else todo[0]
            why = (f"timed out after {timeout:.0f} s" if exit_code is None else f"child exited {exit_code}")
            self.records.append({"step": f"{crashed}/crashed", "status": "fail", "seconds": time.time() - start,
                                 "error": f"{why}; log tail:\n{tail(self.log_path.read_text(), 30)}"})
            print(f"[gpu-check] {crashed}: fail ({why})", flush=True)
            todo = [unit for unit in todo if unit not in done_units and unit != crashed]
            if exit_code is None:
                for unit in todo:
                    self.skip(unit, f"not reached: {step} {why}")
                return

    def run(self) -> dict[str, Any]:
        started = datetime.now(timezone.utc)
        # A dry run trains the tiny model on CPU only; what needs CUDA is recorded as skipped without
        # starting a child (a child on a machine without CUDA would skip the same steps, slower).
        for step, units in self.chosen.items():
            if step == "image":
                self.image_step()
            elif step == "env":
                self.env_step()
            elif step == "models":
                self.child("models", [], units)
            else:
                self.child(step, ["--backend", step.split("-", 1)[1]], units)
        finished = datetime.now(timezone.utc)
        return self.report(started, finished)

    def report(self, started: datetime, finished: datetime) -> dict[str, Any]:
        counts = {status: sum(r["status"] == status for r in self.records) for status in ("pass", "fail", "skipped")}
        bench = {r["detail"]["backend"] + "/" + r["detail"]["shape"]: r["detail"] for r in self.records
                 if r["step"].startswith("bench/") and r["status"] == "pass"}
        image = next((r["detail"] for r in self.records if r["step"] == "image" and "detail" in r), None)
        # The set installed: the one-call set (.gpu-wheels), or the parts mode's, unpacked by parts.py assemble.
        wheel_manifest = next((path for path in (REPO_ROOT / ".gpu-wheels" / "manifest.json",
                                                 Path(tempfile.gettempdir()) / "gpu-wheels" / "manifest.json")
                               if path.is_file()), REPO_ROOT / ".gpu-wheels" / "manifest.json")
        versions = package_versions()
        return {
            "schema": 1,
            "kind": "gpu-check",
            "mode": "dry-run" if self.args.dry_run else "gpu",
            "date": started.date().isoformat(),
            "started_utc": started.isoformat(timespec="seconds"),
            "finished_utc": finished.isoformat(timespec="seconds"),
            "wall_s": round((finished - started).total_seconds(), 1),
            "gpu": gpu_info(),
            "versions": versions,
            "wheel_set": json.loads(wheel_manifest.read_text()) if wheel_manifest.is_file() else None,
            "summary": counts,
            "steps": self.records,
            "bench": bench,
            "bench_rows": bench_rows(bench, counts, image.get("outside") if image else None),
            "anchor": ANCHOR,
            "not_covered": NOT_COVERED_WITH_VLLM.format(version=versions["vllm"]) if versions.get("vllm") and any(
                r["step"].split("/")[1:2] == [VLLM_LABEL] and r["status"] == "pass" for r in self.records)
            else NOT_COVERED,
        }


def chosen_steps(only: Optional[str], dry_run: bool = False) -> dict[str, list[str]]:
    """step -> the units to run, in STEPS order: every step, or what `--only` names, each entry a step
    (`chain-unsloth`) or one unit of it (`chain/unsloth/qwen2.5-0.5b/nf4`, `bench/unsloth/qwen2.5-1.5b`), or a
    case whose sub-steps are units (`chain/unsloth-vllm/qwen2.5-0.5b/nf4`), so a rerun skips what an earlier run
    already proved; a dry run takes the GPU's names (a bench unit of a shape runs its tiny-model stand-in).
    ValueError naming the unknown entries.

    >>> chosen = chosen_steps("chain/unsloth/qwen2.5-0.5b/nf4,bench-unsloth")
    >>> chosen["chain-unsloth"], list(chosen)
    (['chain/unsloth/qwen2.5-0.5b/nf4'], ['chain-unsloth', 'bench-unsloth'])
    """
    entries = [entry.strip() for entry in only.split(",") if entry.strip()] if only else list(STEPS)
    every = {step: step_units(step, dry_run) for step in STEPS}
    on_gpu = {step: step_units(step) for step in STEPS}  # a dry run takes the GPU's unit names too

    def names(entry: str, unit: str) -> bool:
        return unit == entry or unit.startswith(entry + "/")

    unknown = [e for e in entries if e not in every and not any(
        names(e, u) for units in (*every.values(), *on_gpu.values()) for u in units)]
    if unknown:
        raise ValueError(f"unknown step(s) {unknown}; choose from {', '.join(STEPS)}, or units such as "
                         f"{every['chain-unsloth'][-1]}")
    chosen: dict[str, list[str]] = {}
    for step in STEPS:
        if step in entries:
            chosen[step] = every[step]
        elif any(names(e, unit) for e in entries for unit in every[step]):
            chosen[step] = [unit for unit in every[step] if any(names(e, unit) for e in entries)]
        elif any(names(e, unit) for e in entries for unit in on_gpu[step]):
            chosen[step] = every[step]  # a dry run's tiny model stands in for the shapes a GPU unit names
    return chosen


def child_main(args: argparse.Namespace) -> int:
    rec = Recorder(args.results)
    units = args.units.split(",") if args.units else []
    if args.child == "models":
        child_models(args, rec)
    elif args.child.startswith("chain-"):
        args.cases = [tuple(unit.split("/")[2:]) for unit in units]  # (model, precision[, vLLM sub-step])
        child_chain(args, rec)
    else:
        args.shapes = [unit.split("/")[2] for unit in units]
        child_bench(args, rec)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="run_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="report + log folder (default: $OUT)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: $TMPDIR/gpu-check-work)")
    parser.add_argument("--dry-run", action="store_true", help="CPU: the tiny model, one step, no CUDA steps")
    parser.add_argument("--budget-s", type=float, default=float(BUDGET_S),
                        help="stop starting new steps after this long")
    parser.add_argument("--only", default=None, help=f"comma-separated steps ({','.join(STEPS)}) or units of them "
                        "(chain/unsloth/qwen2.5-0.5b/nf4); the budget is shared among the steps chosen")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--units", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.dry_run and args.backend in (None, "plain"):  # --dry-run as the driver passes it: never on a GPU
            freeze_dry_run_imports(args.child)
        args.dry_run = args.dry_run or not has_cuda()
        return child_main(args)
    try:
        chosen_steps(args.only, args.dry_run)
    except ValueError as err:
        print(f"error: --only: {err}", file=sys.stderr)
        return 2
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        print("error: --out is required (or set $OUT): the folder for gpu-report.json and gpu-check.log",
              file=sys.stderr)
        return 2
    args.out = out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = (args.work or Path(tempfile.gettempdir()) / "gpu-check-work").resolve()
    # Scratch: an earlier check's runs would be resumed (a finished one trains no step), so each check starts empty.
    shutil.rmtree(args.work / "runs", ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    driver = Driver(args)
    report = driver.run()
    (args.out / REPORT_NAME).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print_table(report)
    print(f"[gpu-check] report: {args.out / REPORT_NAME}; log: {args.out / LOG_NAME}")
    return 0


if __name__ == "__main__":
    checkout_site()  # grpo_pipeline from this checkout, installed or not
    raise SystemExit(main())
