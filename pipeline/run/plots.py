"""Plots of a training run, drawn from output_dir/metrics.jsonl into output_dir/plots/*.png.

NaN/inf show as gaps (and red crosses on the loss plot), a reward's +-std band is clipped to the range the reward can
take, and the health and KL plots draw the run's warning thresholds.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any, Sequence

from grpo_pipeline.env.paths import atomic_write_bytes
from grpo_pipeline.pipeline.config import HealthArguments
from grpo_pipeline.pipeline.run.metric_names import (
    BETA,
    EVAL_ACCURACY,
    EVAL_FORMAT_RATE,
    GARBLED_RATE,
    INCOMPLETE_UTF8_SHARE,
    NO_ANSWER_RATE,
    OBSERVER_NAME,
    REPETITION_RATE,
)
from grpo_pipeline.rewards.declared import declared_range

METRICS_FILE = "metrics.jsonl"
PLOTS_DIR = "plots"
REWARD_KEY = re.compile(r"^rewards/(?P<name>.+)/mean$")

# Health rates share one [0, 1] axis: label per metric key.
HEALTH_RATES = {
    GARBLED_RATE: "garbled completions",
    REPETITION_RATE: "repeated 4-grams",
    NO_ANSWER_RATE: "no <answer> block",
    INCOMPLETE_UTF8_SHARE: "incomplete-UTF-8 tokens",
}

Series = tuple[list[int], list[float]]


def read_metrics(path: str | Path) -> dict[int, dict[str, Any]]:
    """Logged rows keyed by step. Rows of the same step merge (a resumed run's re-logged step wins).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
    >>> _ = open(path, "w").write('{"step": 1, "loss": 0.5}\\n{"step": 1, "kl": 0.1}\\n{"step": 2, "loss": NaN}\\n')
    >>> rows = read_metrics(path)
    >>> rows[1], math.isnan(rows[2]["loss"])
    ({'step': 1, 'loss': 0.5, 'kl': 0.1}, True)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}; plots are drawn from the {METRICS_FILE} a "
                                "training run writes into its output_dir.")
    rows: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)  # accepts NaN/Infinity, which Python's json writes for non-finite floats
        except json.JSONDecodeError as err:
            warnings.warn(f"{path}:{number}: skipped a line that is not valid JSON ({err.msg})", stacklevel=2)
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)):
            warnings.warn(f"{path}:{number}: skipped a line without a numeric `step`", stacklevel=2)
            continue
        rows.setdefault(int(row["step"]), {}).update(row)
    return dict(sorted(rows.items()))


def series(rows: dict[int, dict[str, Any]], key: str) -> Series | None:
    """(steps, values) of one metric; non-finite values (also the strings "nan"/"inf") become NaN, a gap; None
    when never logged.

    >>> series({1: {"kl": 0.1}, 2: {"loss": 1.0}, 3: {"kl": float("inf")}, 4: {"kl": "nan"}}, "kl")
    ([1, 3, 4], [0.1, nan, nan])
    """
    steps, values = [], []
    for step, row in rows.items():
        value = as_number(row.get(key))
        if value is not None:
            steps.append(step)
            values.append(value if math.isfinite(value) else math.nan)
    return (steps, values) if steps else None


def as_number(value: Any) -> float | None:
    """A logged value as a float: a number, or a string that spells one (metrics.jsonl holds NaN/inf as "nan"/"inf");
    None for None, a bool or anything else. The one reading of a logged value: the health rules' too.

    >>> as_number(3), as_number("inf"), as_number("NaN") != as_number("NaN"), as_number("text"), as_number(True)
    (3.0, inf, True, None, None)
    """
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def moving_average(values: list[float], window: int) -> list[float]:
    """Centred mean over `window` points (fewer at the ends), ignoring NaN; NaN where none is finite. Centred, not
    trailing, so the smooth line does not lag behind the run.

    >>> moving_average([1.0, 2.0, 3.0, float("nan"), 5.0], 3)
    [1.5, 2.0, 2.5, 4.0, 5.0]
    """
    before = (window - 1) // 2
    after = window - 1 - before
    out = []
    for i in range(len(values)):
        finite = [v for v in values[max(0, i - before) : i + after + 1] if not math.isnan(v)]
        out.append(sum(finite) / len(finite) if finite else math.nan)
    return out


def smoothing_window(n_points: int) -> int:
    """About a tenth of the run, between 3 and 25 points; 0 (no smoothing line) below 8 points.

    >>> smoothing_window(5), smoothing_window(40), smoothing_window(1000)
    (0, 4, 25)
    """
    return 0 if n_points < 8 else min(25, max(3, n_points // 10))


def health_thresholds(health=None) -> dict[str, float]:
    """The health rules' thresholds by metric key, from a config's HealthArguments (default: the defaults)."""
    health = health or HealthArguments()
    return {GARBLED_RATE: health.garbled_threshold, REPETITION_RATE: health.repetition_threshold,
            "kl": health.kl_ceiling}


def plot_settings(rewards: Sequence[Any], health: HealthArguments) -> dict[str, Any]:
    """`plot_run`'s keyword arguments for a run: its health thresholds and its rewards' weights (`rewards`: the run's
    RewardSpecs, pipeline/run/decisions.py, each logged under its `logged_name`)."""
    return {"thresholds": health_thresholds(health), "reward_weights": {r.logged_name: r.weight for r in rewards}}


def recorded_plot_settings(recorded: Any) -> dict[str, Any]:
    """`plot_settings` as a run's summary.json recorded them, read as data: its two mappings, each value a number
    (`as_number`); {} when none is recorded.

    >>> recorded_plot_settings({"thresholds": {"kl": 1, "x": "os.system"}, "reward_weights": 3, "other": {}})
    {'thresholds': {'kl': 1.0}}
    """
    if not isinstance(recorded, dict):
        return {}
    return {key: {name: as_number(value) for name, value in values.items() if as_number(value) is not None}
            for key, values in recorded.items()
            if key in plot_settings((), HealthArguments()) and isinstance(values, dict)}


def total_reward_range(weights: dict[str, float]) -> tuple[float, float] | None:
    """The weighted sum's range when every reward's range is known (TRL's total is sum(w * reward)).

    >>> total_reward_range({"correctness_reward_func": 1.0, "int_reward_func": 2.0})
    (0.0, 3.0)
    """
    ranges = {name: declared_range(name) for name in weights}
    if not weights or None in ranges.values():
        return None
    ends = [sorted((w * ranges[n][0], w * ranges[n][1])) for n, w in weights.items()]
    return sum(e[0] for e in ends), sum(e[1] for e in ends)


def plot_run(output_dir: str | Path, thresholds: dict[str, float] | None = None,
             reward_weights: dict[str, float] | None = None) -> list[Path]:
    """Draw the run's plots into output_dir/plots/ and return the written PNG paths, in this order:
    reward_<name>.png per reward function, reward.png (the total), kl.png, beta.png, completion_length.png,
    health.png, eval.png (with eval_steps), loss.png (loss / grad_norm); each only when its metrics were logged.
    `thresholds` (metric key -> value; default: the config's defaults) are drawn as dashed lines;
    `reward_weights` (reward name -> weight) bound the total reward's band.

    >>> import tempfile, json
    >>> run = Path(tempfile.mkdtemp())
    >>> lines = [json.dumps({"step": s, "reward": s / 10, "loss": 0.1}) for s in range(1, 6)]
    >>> _ = (run / "metrics.jsonl").write_text("\\n".join(lines))
    >>> [p.name for p in plot_run(run)]
    ['reward.png', 'loss.png']
    """
    # lazy: matplotlib is imported, and its backend chosen, only when a run draws (a notebook importing the
    # pipeline keeps its own backend until then)
    import matplotlib

    matplotlib.use("Agg")  # no display on training servers; must precede pyplot
    import matplotlib.pyplot as plt  # lazy, as matplotlib above, and after its backend is chosen

    output_dir = Path(output_dir)
    thresholds = {**health_thresholds(), **(thresholds or {})}
    rows = read_metrics(output_dir / METRICS_FILE)
    plots_dir = output_dir / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    @contextlib.contextmanager
    def figure(name: str, title: str, ylabel: str, unit_range: bool = False):
        """One figure of one axis: drawn in the block, then titled, saved whole into plots/ and listed."""
        fig, ax = plt.subplots(figsize=(8, 4.5))
        yield ax
        if unit_range:
            ax.set_ylim(-0.02, 1.02)
        _finish(ax, title, ylabel)
        _save(plt, fig, plots_dir / name, written)

    reward_names = sorted({m["name"] for row in rows.values() for key in row if (m := REWARD_KEY.match(key))})
    for name in reward_names:
        mean = series(rows, f"rewards/{name}/mean")
        if name != OBSERVER_NAME and mean is not None:  # the health observer always scores 0.0: nothing to see
            with figure(f"reward_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png", f"Reward function: {name}",
                        "reward (mean over the batch)") as ax:
                _draw(ax, mean, "mean", "C0", band=series(rows, f"rewards/{name}/std"), clip=declared_range(name))
    if (total := series(rows, "reward")) is not None:
        with figure("reward.png", "Total reward (weighted sum of the reward functions)",
                    "reward (mean over the batch)") as ax:
            _draw(ax, total, "total reward", "C0", band=series(rows, "reward_std"),
                  clip=total_reward_range(reward_weights or {}))
    if (kl := series(rows, "kl")) is not None:
        with figure("kl.png", "KL divergence to the reference model", "kl (per token)") as ax:
            _draw(ax, kl, "kl", "C3")
            _threshold(ax, thresholds.get("kl"), "kl_ceiling", "C3")
    if (beta := series(rows, BETA)) is not None:
        with figure("beta.png", "KL coefficient beta (adaptive beta moves it toward kl_target)", "beta") as ax:
            ax.plot(*beta, color="C4", marker=".", label="beta")
    if (length := series(rows, "completions/mean_length") or series(rows, "health/completion_length")) is not None:
        with figure("completion_length.png", "Completion length", "tokens") as ax:
            low, high = series(rows, "completions/min_length"), series(rows, "completions/max_length")
            if low is not None and high is not None and low[0] == high[0]:
                ax.fill_between(low[0], low[1], high[1], color="C2", alpha=0.15, label="min..max")
            _draw(ax, length, "mean length", "C2")
    if rates := {key: s for key in HEALTH_RATES if (s := series(rows, key)) is not None}:
        window = smoothing_window(max(len(data[0]) for data in rates.values()))
        subtitle = f"\nthin: per step, bold: {window}-step average" if window else ""
        with figure("health.png", f"Training health (share per batch){subtitle}", "share", unit_range=True) as ax:
            for index, (key, data) in enumerate(rates.items()):
                _draw(ax, data, HEALTH_RATES[key], f"C{index}", compact=True)
                _threshold(ax, thresholds.get(key), f"{key.split('/')[-1].replace('_rate', '')}_threshold",
                           f"C{index}")
    if (accuracy := series(rows, EVAL_ACCURACY)) is not None:
        with figure("eval.png", "Held-out evaluation during training (every eval_steps)",
                    "share of held-out problems", unit_range=True) as ax:
            _plot_eval(ax, accuracy, series(rows, EVAL_FORMAT_RATE))
    panels = [(name, data) for name in ("loss", "grad_norm") if (data := series(rows, name)) is not None]
    if panels:
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), sharex=True, squeeze=False)
        for ax, (name, data) in zip(axes[:, 0], panels):
            _draw(ax, data, name, "C1" if name == "loss" else "C5")
            # red crosses on the x axis where it was NaN/inf (a gap alone is easy to miss)
            if bad := [step for step, row in rows.items()
                       if (value := as_number(row.get(name))) is not None and not math.isfinite(value)]:
                ax.scatter(bad, [0] * len(bad), marker="x", color="red", s=60, zorder=5,
                           transform=ax.get_xaxis_transform(), clip_on=False, label=f"{name} NaN/inf")
            _finish(ax, "Loss and gradient norm" if ax is axes[0, 0] else None, name, xlabel=ax is axes[-1, 0])
        _save(plt, fig, plots_dir / "loss.png", written)
    return written


def _save(plt, fig, path: Path, written: list[Path]) -> None:
    """Margins fixed in inches (room for the y tick labels and label, the x label, and the title's lines), not
    fig.tight_layout(): that measures every text on the figure before the draw measures it again, a third of a
    run's plotting time."""
    width, height = fig.get_size_inches()
    title_lines = max((ax.get_title().count("\n") + 1 for ax in fig.axes if ax.get_title()), default=0)
    fig.subplots_adjust(left=0.9 / width, right=1 - 0.2 / width, bottom=0.6 / height,
                        top=1 - (0.15 + 0.25 * title_lines) / height, hspace=0.12)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())  # a full disk leaves the previous plot, never half a PNG
    written.append(path)


def _plot_eval(ax, accuracy: Series, format_rate: Series | None) -> None:
    ax.plot(*accuracy, color="C0", marker="o", label="held-out accuracy")
    if format_rate is not None:
        ax.plot(*format_rate, color="C2", marker=".", linestyle="--", label="held-out format rate")
    if finite := [(v, s) for s, v in zip(*accuracy) if not math.isnan(v)]:
        value, step = max(finite, key=lambda pair: (pair[0], -pair[1]))  # the first best, as best_lora/ keeps
        ax.scatter([step], [value], marker="*", s=220, color="C3", zorder=5,
                   label=f"best {value:.0%} at step {step} (best_lora/)")


def _threshold(ax, value: float | None, label: str, color: str) -> None:
    """A health rule's threshold as a dashed horizontal line."""
    if value is not None and math.isfinite(value):
        ax.axhline(value, color=color, linestyle="--", linewidth=1, alpha=0.8, label=f"{label} {value:g}")


def _draw(ax, data: Series, label: str, color: str, band: Series | None = None, compact: bool = False,
          clip: tuple[float, float] | None = None) -> None:
    """Raw values as a thin line with dots, the moving average as a bold line, +-std as a band clipped to `clip`
    (the values the metric can take). `compact` (several series on one axis) labels only the bold line."""
    steps, values = data
    window = smoothing_window(len(values))
    raw_label = label if not window else (None if compact else f"{label} (per step)")
    ax.plot(steps, values, color=color, alpha=0.45 if window else 0.9, linewidth=1, marker=".",
            markersize=3, label=raw_label)
    if window:
        ax.plot(steps, moving_average(values, window), color=color, linewidth=2.2,
                label=label if compact else f"{label} ({window}-step average)")
    if band is not None and band[0] == steps:
        lowest, highest = clip or (-math.inf, math.inf)
        low = [max(lowest, v - s) for v, s in zip(values, band[1])]
        high = [min(highest, v + s) for v, s in zip(values, band[1])]
        ax.fill_between(steps, low, high, color=color, alpha=0.12, label="+-1 std")


def _finish(ax, title: str | None, ylabel: str, xlabel: bool = True) -> None:
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
