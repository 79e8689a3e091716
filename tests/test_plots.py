"""plot_run: PNGs from a run's metrics.jsonl, skipping what the run did not log."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from grpo_pipeline.pipeline.run.plots import moving_average, plot_run, read_metrics, series


def _write_metrics(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    # json.dumps writes NaN/Infinity for non-finite floats, as the training driver's writer does.
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _full_rows(n: int = 40) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for step in range(1, n + 1):
        rows.append({
            "step": step, "loss": rng.gauss(0, 0.01), "grad_norm": abs(rng.gauss(0.4, 0.1)), "learning_rate": 5e-6,
            "reward": step / 20 + rng.gauss(0, 0.3), "reward_std": 0.4,
            "rewards/xmlcount/mean": rng.random() * 0.5, "rewards/xmlcount/std": 0.1,
            "rewards/correctness/mean": min(2.0, step / 20), "rewards/correctness/std": 0.5,
            "rewards/health/mean": 0.0, "rewards/health/std": 0.0,
            "kl": 0.002 * step, "health/beta": 0.04,
            "completions/mean_length": 200 - step, "completions/min_length": 40, "completions/max_length": 256,
            "health/garbled_rate": rng.random() * 0.05, "health/repetition_rate": rng.random() * 0.2,
            "health/no_answer_rate": max(0.0, 1 - step / 20), "health/incomplete_utf8_share": 0.0,
        })
    if n > 13:  # a NaN/inf step must not break the plot (it shows as a gap and a red cross)
        rows[10]["grad_norm"] = math.nan
        rows[11]["loss"] = math.inf
        rows[12]["loss"] = "nan"  # grpo_pipeline.pipeline.run.log writes non-finite values as strings
    return rows


def _pixels_vary(path: Path) -> bool:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    return image.shape[0] > 300 and image.shape[1] > 600 and float(image[..., :3].std()) > 0.05


def test_full_run_writes_every_plot(tmp_path):
    _write_metrics(tmp_path, _full_rows())
    paths = plot_run(tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(["reward_correctness.png", "reward_xmlcount.png", "reward.png", "kl.png", "beta.png",
                            "completion_length.png", "health.png", "loss.png"])
    for path in paths:
        assert path.parent == tmp_path / "plots" and path.is_file()
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 15_000
        assert _pixels_vary(path)
    # The observer's always-zero reward gets no plot.
    assert not (tmp_path / "plots" / "reward_health.png").exists()


def test_missing_metrics_are_skipped(tmp_path):
    # A beta = 0 run without the health observer: no kl, beta or health/* keys.
    rows = [{"step": s, "loss": 0.1, "reward": s / 10, "rewards/int/mean": 0.5,
             "completions/mean_length": 100.0} for s in range(1, 6)]
    rows.append({"step": 5, "train_runtime": 3.2, "train_loss": 0.1})  # end-of-training summary line
    _write_metrics(tmp_path, rows)
    names = sorted(p.name for p in plot_run(tmp_path))
    assert names == ["completion_length.png", "loss.png", "reward.png", "reward_int.png"]
    assert not (tmp_path / "plots" / "kl.png").exists()


def test_run_without_any_known_metric_writes_nothing(tmp_path):
    _write_metrics(tmp_path, [{"step": 1, "learning_rate": 1e-5}])
    assert plot_run(tmp_path) == []


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    _write_metrics(tmp_path, _full_rows(10))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 11, "loss": 0.')  # a run killed mid-write
    with pytest.warns(UserWarning, match=r"metrics.jsonl:11: skipped"):
        rows = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(rows) == list(range(1, 11))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path)


def test_resumed_run_rows_merge_by_step(tmp_path):
    _write_metrics(tmp_path, [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 2, "loss": 5.0, "kl": 0.1}])
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[2] == {"step": 2, "loss": 5.0, "kl": 0.1}
    assert series(rows, "loss") == ([1, 2], [1.0, 5.0])
    assert series(rows, "missing") is None


def test_non_finite_strings_are_values_not_missing(tmp_path):
    _write_metrics(tmp_path, [{"step": 1, "loss": 0.5}, {"step": 2, "loss": "nan"}, {"step": 3, "loss": "inf"},
                              {"step": 4, "loss": "oops"}])
    steps, values = series(read_metrics(tmp_path / "metrics.jsonl"), "loss")
    assert steps == [1, 2, 3] and values[0] == 0.5 and all(math.isnan(v) for v in values[1:])


def test_moving_average_is_centred_and_skips_nan():
    assert moving_average([0.0, 0.0, 3.0, 0.0, 0.0], 3) == [0.0, 1.0, 1.0, 1.0, 0.0]
    smoothed = moving_average([1.0, math.nan, math.nan, math.nan, 2.0], 3)
    assert smoothed[0] == 1.0 and math.isnan(smoothed[2]) and smoothed[4] == 2.0


def _record(monkeypatch, method: str) -> list:
    """Record every call of matplotlib's Axes.<method> (then draw as usual), with its axes (titled later)."""
    from matplotlib.axes import Axes

    calls, original = [], getattr(Axes, method)

    def spy(ax, *args, **kwargs):
        calls.append((ax, args, kwargs))
        return original(ax, *args, **kwargs)

    monkeypatch.setattr(Axes, method, spy)
    return calls


def test_every_text_of_every_plot_lies_inside_its_figure(tmp_path, monkeypatch):
    """The margins (pipeline/run/plots.py _save) leave room for each title (one line or two: health.png), axis label,
    tick label and offset text, on one axis and on the two-panel loss plot, with large, tiny and negative values."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import grpo_pipeline.pipeline.run.plots as plots

    rows = _full_rows()
    for row in rows:
        row["loss"] = -1234567.0 * row["step"]  # an offset text ("1e7") and long tick labels
        row["kl"] = 1e-6 * row["step"]
    rows.append({"step": 40, "eval/accuracy": 0.5, "eval/format_rate": 0.9})
    _write_metrics(tmp_path, rows)
    saved, save = [], plots._save
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path, written: (save(plt, fig, path, written),
                                                                        saved.append((path.name, fig))))
    plot_run(tmp_path)
    assert {name for name, _ in saved} >= {"health.png", "loss.png", "eval.png", "kl.png"}
    for name, fig in saved:
        renderer = FigureCanvasAgg(fig).get_renderer()  # pyplot's close took the figure's canvas away
        drawn = fig.get_tightbbox(renderer)  # every drawn artist, texts included, in inches (what tight_layout reads)
        width, height = fig.get_size_inches()
        assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, (name, drawn)


def test_std_bands_stay_inside_each_rewards_possible_range(tmp_path, monkeypatch):
    rows = _full_rows()
    for row in rows:  # names as TRL logs the built-in rewards; a wide std pushes the band past both ends
        row["rewards/correctness_reward_func/mean"], row["rewards/correctness_reward_func/std"] = 1.5, 1.0
        row["rewards/xmlcount_reward_func/mean"], row["rewards/xmlcount_reward_func/std"] = 0.1, 0.3
        row["reward"], row["reward_std"] = 0.2, 1.0
    _write_metrics(tmp_path, rows)
    bands = _record(monkeypatch, "fill_between")
    plot_run(tmp_path, reward_weights={"correctness_reward_func": 1.0, "xmlcount_reward_func": 1.0})
    by_title = {ax.get_title(): (min(args[1]), max(args[2])) for ax, args, kwargs in bands
                if kwargs.get("label") == "+-1 std"}
    assert by_title["Reward function: correctness_reward_func"] == (0.5, 2.0)
    assert by_title["Reward function: xmlcount_reward_func"] == (0.0, 0.4)
    assert by_title["Total reward (weighted sum of the reward functions)"] == (0.0, 1.2)
    assert by_title["Reward function: correctness"] == (min(r["rewards/correctness/mean"] for r in rows) - 0.5,
                                                         max(r["rewards/correctness/mean"] for r in rows) + 0.5)


def test_health_and_kl_plots_draw_the_warning_thresholds(tmp_path, monkeypatch):
    _write_metrics(tmp_path, _full_rows())
    lines = _record(monkeypatch, "axhline")
    plot_run(tmp_path, thresholds={"health/garbled_rate": 0.25})
    drawn = {kwargs["label"]: args[0] for ax, args, kwargs in lines}
    assert drawn == {"garbled_threshold 0.25": 0.25, "repetition_threshold 0.6": 0.6, "kl_ceiling 1": 1.0}


def test_a_runs_plot_settings_come_from_its_config():
    from grpo_pipeline.pipeline.config import from_mapping
    from grpo_pipeline.pipeline.run.decisions import reward_specs
    from grpo_pipeline.pipeline.run.plots import plot_settings
    from grpo_pipeline.rewards import get_reward_funcs

    cfg = from_mapping({"reward_funcs": ["correctness", "xmlcount"], "reward_weights": [1.0, 2.0],
                        "garbled_threshold": 0.2})
    settings = plot_settings(reward_specs(cfg.grpo.reward_funcs, cfg.grpo.reward_weights,
                                          get_reward_funcs(list(cfg.grpo.reward_funcs))), cfg.health)
    assert settings["reward_weights"] == {"correctness_reward_func": 1.0, "xmlcount_reward_func": 2.0}
    assert settings["thresholds"]["health/garbled_rate"] == 0.2


# --- plots: false, then `grpo plot --run` ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_with_plots_off_draws_none_and_grpo_plot_draws_them_later_with_the_runs_thresholds(tmp_path, capsys):
    import shutil

    from grpo_pipeline.pipeline.train import run_training
    from tests.cli_helpers import run_cli
    from train_helpers import demo_config

    run_dir = tmp_path / "run"
    result = run_training(demo_config(run_dir, max_steps=2, plots=False, garbled_threshold=0.25))
    assert result.status == "completed" and not (run_dir / "plots").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["plots"] == [] and summary["plot_settings"]["thresholds"]["health/garbled_rate"] == 0.25
    # the closing lines say how to draw them
    assert f"  plots        none drawn (plots: false): grpo plot --run {run_dir}\n" in capsys.readouterr().out

    defaults = tmp_path / "defaults"  # the same metrics drawn with the default thresholds
    shutil.copytree(run_dir, defaults)
    (defaults / "summary.json").unlink()  # as a run still training has none: the defaults, and a note saying so
    code, out = run_cli(["plot", "--run", str(defaults)], capsys)
    assert code == 0 and "the default health thresholds are drawn" in out, out
    code, out = run_cli(["plot", "--run", str(run_dir)], capsys)
    assert code == 0 and "default" not in out and str(run_dir / "plots") in out, out
    drawn = sorted(p.name for p in (run_dir / "plots").iterdir())
    assert drawn == sorted(p.name for p in (defaults / "plots").iterdir()) and {"reward.png", "health.png"} <= set(drawn)
    # the run's garbled_threshold (0.25, not the default 0.3) is the dashed line of its health plot
    assert (run_dir / "plots" / "health.png").read_bytes() != (defaults / "plots" / "health.png").read_bytes()
    assert (run_dir / "plots" / "reward.png").read_bytes() == (defaults / "plots" / "reward.png").read_bytes()


@pytest.mark.parametrize("what", ["missing", "no metrics.jsonl", "a file"])
def test_grpo_plot_of_what_is_not_a_run_folder_is_exit_2_naming_run(what, tmp_path, capsys):
    from tests.cli_helpers import run_cli

    folder = tmp_path / "run"
    if what == "no metrics.jsonl":
        folder.mkdir()
    elif what == "a file":
        folder.write_text("x")
    code, out = run_cli(["plot", "--run", str(folder)], capsys)
    assert code == 2 and "--run" in out and str(folder) in out and "Traceback" not in out, out
    assert len(out.strip().splitlines()) == 1, out
