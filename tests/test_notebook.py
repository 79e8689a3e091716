"""The Colab/AutoDL notebook: committed without outputs, pinned like env/known_good.toml, and runnable.

`test_notebook_runs_in_smoke_mode` executes every code cell with nbclient in smoke mode (the built-in
tiny CPU demo), the way CI does, and fails on the first cell that raises. Its run starts from the format warm-up
the shortened demo (tests/conftest.py demo_run, the same settings) trained, as a rerun of the cell would: the
warm-up itself is tests/test_demo_run.py's. Set GRPO_NOTEBOOK_EXECUTED=path
to keep the executed copy for reading (outputs included).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from packaging.utils import canonicalize_name

from train_helpers import DEMO_RUN_WARMUP_STEPS, NOTEBOOK

ROOT = Path(__file__).resolve().parents[1]
SMOKE_BUDGET_S = 300  # a cell that runs longer has hung (nbclient stops it); the time is printed, not asserted
SKIP_LINE = "skipped in smoke mode: needs a GPU"
SMOKE_STEPS = 10  # the smoke run's GRPO steps (the configure cell's max_steps), as the cell prints them
PIN = re.compile(r"""["']([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^"'\s,;]*)["']""")


def read_notebook() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def install_cell(nb: nbformat.NotebookNode) -> str:
    cells = [cell.source for cell in code_cells(nb) if "GPU_PINS = [" in cell.source]
    assert len(cells) == 1, "exactly one code cell must define GPU_PINS (the install cell)"
    return cells[0]


def test_committed_notebook_has_no_outputs():
    nb = read_notebook()
    nbformat.validate(nb)
    dirty = [index for index, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, (f"code cells {dirty} of {NOTEBOOK.name} have outputs or execution counts; commit it "
                       "stripped (notebooks/README.md has the one-line command)")
    assert nb.metadata.kernelspec.name == "python3"


def test_first_code_cell_reads_the_smoke_switch():
    first = code_cells(read_notebook())[0].source
    assert 'SMOKE = os.environ.get("GRPO_NOTEBOOK_SMOKE", "auto")' in first


def test_install_cell_pins_match_known_good_gpu_set():
    from grpo_pipeline.env.matrix import load_matrix

    gpu_set = load_matrix().packages("gpu")
    expected = {key: pin.exact for key, pin in gpu_set.items() if pin.exact}
    found: dict[str, str] = {}
    for name, version in PIN.findall(install_cell(read_notebook())):
        key = canonicalize_name(name)
        assert key not in found, f"{name} is pinned twice in the install cell"
        found[key] = version
    listing = ",\n".join(f'    "{gpu_set[key].name}=={version}"' for key, version in expected.items())
    assert found == expected, (
        "the notebook's GPU_PINS disagree with env/known_good.toml's gpu set; replace the list with:\n"
        f"GPU_PINS = [\n{listing},\n]"
    )


def test_install_cell_installs_the_gpu_extra_with_the_pins():
    source = install_cell(read_notebook())
    assert 'f"{REPO_ROOT}[gpu]", *GPU_PINS' in source


def test_install_cell_stops_when_no_driver_answers(monkeypatch):
    """No driver found is not "fine": the cell stops (no pip run) instead of installing the CUDA 13 set blind."""
    import subprocess

    import grpo_pipeline.env.probes

    ran = []
    monkeypatch.setattr(grpo_pipeline.env.probes, "nvidia_driver_version", lambda: None)
    monkeypatch.setattr(subprocess, "run", lambda args, **kw: ran.append(list(args)))
    namespace = {"SMOKE": False, "REPO_ROOT": ROOT, "REPO_URL": "unused", "sys": sys, "subprocess": subprocess}
    with pytest.raises(SystemExit) as stop:
        exec(install_cell(read_notebook()), namespace)  # noqa: S102 - the notebook's own cell
    assert "No NVIDIA driver answered" in str(stop.value) and "GRPO_NOTEBOOK_SMOKE=1" in str(stop.value)
    assert ran == []


@pytest.fixture
def python3_kernel(tmp_path, monkeypatch) -> str:
    """A `python3` kernelspec for *this* interpreter, first on JUPYTER_PATH.

    The spec ipykernel installs runs `python` from PATH, which may be another interpreter (or none);
    this one cannot be.
    """
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(tmp_path / "jupyter"),
                                                                     os.environ.get("JUPYTER_PATH")])))
    return "python3"


def outputs_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/markdown") or output.data.get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.xdist_group("demo")  # on the worker that trained demo_run
def test_notebook_runs_in_smoke_mode(tmp_path, monkeypatch, python3_kernel, demo_run):
    import shutil

    from nbclient import NotebookClient

    out = tmp_path / "out"
    # The demo's warm-up, kept where the smoke run keeps its own (output_dir/warmup, keyed by its settings)
    shutil.copytree(demo_run[0] / "warmup", out / "smoke-demo" / "warmup")
    monkeypatch.setenv("GRPO_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("GRPO_NOTEBOOK_OUT", str(out))
    # The kernel imports the checkout under test, installed or not.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = read_notebook()
    client = NotebookClient(nb, kernel_name=python3_kernel, timeout=SMOKE_BUDGET_S,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})  # cwd as in Jupyter
    started = time.monotonic()
    try:
        client.execute()  # raises CellExecutionError (with the cell and its traceback) when a cell fails
    finally:
        keep = os.environ.get("GRPO_NOTEBOOK_EXECUTED")
        if keep:
            nbformat.write(nb, keep)
    elapsed = time.monotonic() - started
    print(f"notebook smoke run: {elapsed:.0f} s")

    cells = code_cells(nb)
    text = [outputs_text(cell) for cell in cells]
    assert all(cell.execution_count for cell in cells), "every code cell ran"
    assert text[1].startswith("mode      smoke"), text[1]
    # GPU-only cells say so and skip: the install cell and the GGUF export.
    skipped = [i for i, t in enumerate(text) if SKIP_LINE in t]
    assert install_cell(nb) == cells[skipped[0]].source and len(skipped) == 2, skipped

    run_dir = out / "smoke-demo"
    assert "[grpo] format warm-up: reusing " in text[6], text[6][-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == SMOKE_STEPS
    # what the configure cell says is what ran: the warm-up demo_run trained (reused above) and SMOKE_STEPS of GRPO
    assert f"with {DEMO_RUN_WARMUP_STEPS} format warm-up steps and {SMOKE_STEPS} GRPO steps" in text[5], text[5]
    assert summary["eval_before"]["n"] == summary["eval_after"]["n"] == 20
    assert (run_dir / "lora" / "adapter_config.json").is_file()
    assert (run_dir / "merged16" / "config.json").is_file()
    html = "".join(o.data["text/html"] for cell in cells for o in cell.outputs if "text/html" in o.get("data", {}))
    assert html.count('<img width="420" src="data:image/png;base64,') == len(summary["plots"]) >= 2
    assert any("| question | reference | base model |" in t for t in text)
    assert any("held-out problems | before GRPO | after GRPO | change |" in t for t in text)


def test_keep_on_drive_is_off_by_default_and_puts_outputs_on_drive_on_colab(monkeypatch):
    """The first two cells with KEEP_ON_DRIVE = True on (a stand-in for) Colab: Drive is mounted once and the
    outputs go there; the committed default is False."""
    import types

    first, second = (cell.source for cell in code_cells(read_notebook())[:2])
    assert "\nKEEP_ON_DRIVE = False\n" in first
    mounted, made = [], []
    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=mounted.append)
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "test")
    monkeypatch.delenv("GRPO_NOTEBOOK_OUT", raising=False)
    monkeypatch.setenv("GRPO_NOTEBOOK_SMOKE", "1")
    for name in ("HF_HOME", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored afterwards: the cell sets them
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: made.append(self))  # nothing created under /content
    namespace: dict = {}
    exec(first.replace("\nKEEP_ON_DRIVE = False\n", "\nKEEP_ON_DRIVE = True\n"), namespace)
    exec(second, namespace)
    assert mounted == ["/content/drive"]
    assert namespace["OUTPUT_ROOT"] == Path("/content/drive/MyDrive/grpo-outputs") and made == [namespace["OUTPUT_ROOT"]]
