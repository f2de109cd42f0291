"""The study plots as SVG or PNG, drawn with matplotlib's object API on the Agg/SVG canvases (no
pyplot, so no global state and no GUI backend; safe from several request threads at once).

`render(kind, data, fmt)` takes the plain data `analysis.plotdata.plot_data` loads. Kinds follow
the playbook: `axis` (basic hyperparameter axis plots, infeasible trials as red crosses), `isolation`
(best over nuisance per scientific value, error bars from replicas), `curves` (train and validation
against step for the best trials, checkpoints marked), `grad_norm` (against step and a histogram,
with the 90th percentile), `best_steps` (where retrospective selection finds the best step) and
`budget` (Figure 3's box plots by number of trials)."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from hpo.server.analysis.model import TrialSummary  # noqa: E402
from hpo.server.dashboard.charts.common import robust_range  # noqa: E402
from hpo.server.space.search_space import Dimension, from_unit  # noqa: E402

FORMATS = {"svg": "image/svg+xml", "png": "image/png"}
DPI = 150  # PNGs for reports: readable when printed or zoomed
WIDTH = 11.0  # every figure is this many inches wide (panels share it), so reports line up
LEGEND = 9  # font sizes in points: legends, tick and axis labels, panel titles
LABEL = 9
PANEL_TITLE = 10
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
INFEASIBLE = "#d62728"


def render(kind: str, data: dict[str, Any], fmt: str = "svg") -> bytes:
    """The plot `kind` of `data` as SVG or PNG bytes. An empty study draws a figure that says so."""
    fig = _DRAW[kind](data)
    return _save(fig, fmt)


def _save(fig: Figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": "hpo"}
    fig.savefig(buffer, format=fmt, metadata=metadata, dpi=DPI)
    return buffer.getvalue()


def _grid(n: int, height: float = 3.6, cols: int = 2) -> tuple[Figure, list[Axes]]:
    """A figure of `n` panels, `cols` to a row, WIDTH wide, with fixed margins: matplotlib's
    constrained layout would cost most of a second per figure, and the plots must render in well
    under one."""
    n = max(n, 1)
    ncols = min(cols, n)
    nrows = math.ceil(n / ncols)
    fig = _figure(WIDTH, height * nrows)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(n)]
    return fig, axes


def _figure(width: float, height: float) -> Figure:
    """A figure with margins fixed in inches (room for tick labels, axis labels and the title)."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(
        left=0.85 / width, right=1 - 0.25 / width, bottom=0.75 / height, top=1 - 0.8 / height, wspace=0.3, hspace=0.6
    )
    return fig


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _title(fig: Figure, data: dict[str, Any], what: str) -> None:
    """The study's name (shortened in the middle when long) over what the figure shows, on two
    lines, so neither is ever cut at the figure's edge."""
    width = fig.get_figwidth()
    fig.suptitle(f"{_fit(str(data['study']), width, 11)}\n{_fit(what, width, 10)}", fontsize=10.5)


def _fit(text: str, width_inches: float, points: float) -> str:
    """`text` shortened in the middle to what fits `width_inches` at `points` (0.6 em per char)."""
    room = max(12, int(width_inches * 72 / (points * 0.6)) - 2)
    return text if len(text) <= room else text[: room // 2 - 1] + "…" + text[-(room - room // 2) :]


def _wrap(label: str, chars: int = 18) -> str:
    """A long category label over several lines, split after `=` and `,` first
    (`optimizer=nesterov` is never cut)."""
    if len(label) <= chars:
        return label
    parts = label.replace(", ", ",\n").replace("=", "=\n").split("\n")
    return "\n".join(line for part in parts for line in textwrap.wrap(part, chars, break_on_hyphens=False)) or label


# --- axis -------------------------------------------------------------------------------------


def axis_plot(data: dict[str, Any]) -> Figure:
    """Objective against each varied hyperparameter: one point per trial, infeasible ones as red
    crosses above the worst value, log axes for log scales, the searched range dashed."""
    dims: list[Dimension] = data["dims"]
    trials: list[TrialSummary] = [t for t in data["trials"] if t.replica_of is None]
    fig, axes = _grid(len(dims))
    _title(fig, data, f"{data['metric']} against each hyperparameter (axis plots)")
    if not dims:
        _empty(axes[0], "no varied hyperparameters")
    arms = sorted({t.arm_key for t in trials})
    for ax, dim in zip(axes, dims, strict=False):
        _axis_panel(ax, dim, trials, arms, data)
    return fig


def _axis_panel(ax: Axes, dim: Dimension, trials: list[TrialSummary], arms: list[str], data: dict[str, Any]) -> None:
    mine = [t for t in trials if dim.name in t.params and dim.applies(t.arm)]
    feasible = [t for t in mine if t.feasible]
    bad = [t for t in mine if t.infeasible]
    worst = _worst_row(ax, [float(t.objective or 0.0) for t in feasible], data["mode"])
    for i, key in enumerate(arms):
        group = [t for t in feasible if t.arm_key == key]
        if group:
            xs, ys = _xs(dim, group), [float(t.objective or 0.0) for t in group]
            ax.scatter(xs, ys, s=18, color=COLORS[i % len(COLORS)], label=_arm_name(group[0].arm), alpha=0.85)
    if bad:
        ax.scatter(_xs(dim, bad), [worst] * len(bad), marker="x", s=30, color=INFEASIBLE, label="infeasible")
    _mark_best(ax, dim, feasible, data["mode"])
    _scale_axis(ax, dim)
    flagged = [side for label, side in data["flagged"] if label == dim.label]
    ax.set_title(
        dim.label + (f"  [best at {flagged[0]} edge]" if flagged else ""),
        fontsize=PANEL_TITLE,
        color=INFEASIBLE if flagged else "black",
    )
    ax.set_ylabel(data["metric"], fontsize=LABEL)
    if len(arms) > 1 or bad:
        ax.legend(fontsize=LEGEND)


def _worst_row(ax: Axes, values: list[float], mode: str) -> float:
    """Where infeasible trials are drawn: just beyond the worst feasible value."""
    if not values:
        return 1.0
    span = (max(values) - min(values)) or 1.0
    return max(values) + 0.08 * span if mode == "min" else min(values) - 0.08 * span


def _mark_best(ax: Axes, dim: Dimension, feasible: list[TrialSummary], mode: str) -> None:
    if not feasible:
        return
    sign = 1.0 if mode == "min" else -1.0
    best = min(feasible, key=lambda t: sign * float(t.objective or 0.0))
    ax.scatter(
        _xs(dim, [best]), [float(best.objective or 0.0)], marker="*", s=140, color="gold", edgecolor="black", zorder=5
    )


def _xs(dim: Dimension, trials: Sequence[TrialSummary]) -> list[Any]:
    if dim.type == "categorical":
        return [list(map(str, dim.values)).index(str(t.params[dim.name])) for t in trials]
    return [t.params[dim.name] for t in trials]


def _scale_axis(ax: Axes, dim: Dimension) -> None:
    if dim.type == "categorical":
        ax.set_xticks(range(len(dim.values)), [_wrap(str(v)) for v in dim.values], fontsize=LABEL)
        return
    lo, hi = (dim.min or 0.0, dim.max or 1.0) if dim.type != "discrete" else (min(dim.values), max(dim.values))
    if dim.scale == "log":
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_plain_log_label))
    elif dim.scale == "reverse_log":
        ax.set_xscale("function", functions=(_rev, _rev_inv))
        ax.set_xticks([lo, 1 - math.sqrt((1 - lo) * (1 - hi)), hi])
    ax.minorticks_off()  # minor ticks on log axes cost a third of the drawing time
    if dim.type != "discrete":  # the searched range with a margin, whatever was sampled
        data = [x for points in ax.collections for x in np.asarray(points.get_offsets())[:, 0].tolist()]
        left, right = from_unit(dim, -0.05), from_unit(dim, 1.05)
        ax.set_xlim(min([left, *data]), max([right, *data]))
    for bound in (lo, hi):
        ax.axvline(bound, color="#999", linestyle="--", linewidth=0.8)


def _plain_log_label(x: float, _pos: int) -> str:
    """`1e-03` instead of matplotlib's mathtext 10^-3, which costs a millisecond per label to lay out."""
    return f"{x:.0e}".replace("e+00", "").replace("e-0", "e-").replace("e+0", "e")


def _rev(x: Any) -> Any:
    return -np.log1p(-np.minimum(np.asarray(x, dtype=float), 1 - 1e-12))


def _rev_inv(y: Any) -> Any:
    return 1 - np.exp(-np.asarray(y, dtype=float))


# --- isolation --------------------------------------------------------------------------------


def isolation_plot(data: dict[str, Any]) -> Figure:
    """Best over the nuisance hyperparameters for each scientific value, error bars from replicas."""
    series = data["series"]
    fig, axes = _grid(len(series))
    _title(fig, data, "isolation plots (best trial per scientific value)")
    if not series:
        _empty(axes[0], "no scientific hyperparameters")
    for ax, s in zip(axes, series, strict=False):
        points = [p for p in s["points"] if p["best_value"] is not None]
        xs = list(range(len(points))) if s["kind"] == "arms" else [p["x"] for p in points]
        ys = [p["best_value"] for p in points]
        if s["kind"] == "buckets":
            # the bucket's bootstrap interval of its best value (analysis/isolation.py), asymmetric
            lo = [max(0.0, y - (y if p.get("lo") is None else p["lo"])) for p, y in zip(points, ys, strict=True)]
            hi = [max(0.0, (y if p.get("hi") is None else p["hi"]) - y) for p, y in zip(points, ys, strict=True)]
            errs: Any = [lo, hi]
            if s.get("scale") == "log":
                ax.set_xscale("log")
        else:
            errs = [p["std"] or 0.0 for p in points]
        joined = s["kind"] == "buckets" or s.get("ordered")  # values along an order: the line shows its shape
        ax.errorbar(xs, ys, yerr=errs, fmt="o-" if joined else "o", capsize=4, color=COLORS[0])
        if s["kind"] == "arms":
            ax.set_xticks(xs, [_wrap(str(p["x"])) for p in points], fontsize=LABEL)
            ax.set_xlim(-0.5, len(points) - 0.5)
        title = s["param"] + (f" ({s['label']})" if s.get("label") and s["label"] != "all trials" else "")
        ax.set_title(title, fontsize=PANEL_TITLE)
        ax.set_ylabel(f"best {data['metric']}", fontsize=LABEL)
    return fig


# --- curves -----------------------------------------------------------------------------------


def curves_plot(data: dict[str, Any]) -> Figure:
    """Training loss and the validation objective against step for the best trials of each arm,
    the best step starred and each kept checkpoint marked."""
    fig = _figure(WIDTH, 4.4)
    train_ax, valid_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _title(fig, data, "training curves of the best trials")
    entries = data["entries"]
    if not entries:
        _empty(valid_ax, "no completed trials yet")
    for i, entry in enumerate(entries):
        color = COLORS[i % len(COLORS)]
        series = data["curves"].get(entry["trial_id"], {})
        _line(train_ax, series.get("train/loss"), color, entry["label"])
        _line(train_ax, series.get("valid/loss"), color, None, dashed=True)
        objective = series.get(data["metric"])
        _line(valid_ax, objective, color, entry["label"])
        _mark_checkpoints(valid_ax, objective, data["checkpoints"].get(entry["trial_id"], []), color, data["mode"])
    _robust_log_y(train_ax)
    train_ax.set_title("train/loss (solid), valid/loss (dashed), log scale", fontsize=PANEL_TITLE)
    valid_ax.set_title(f"{data['metric']} (* best step, | checkpoints)", fontsize=PANEL_TITLE)
    for ax in (train_ax, valid_ax):
        ax.set_xlabel("step", fontsize=LABEL)
    if entries:
        valid_ax.legend(fontsize=LEGEND)
    return fig


def _line(ax: Axes, curve: Any, color: str, label: str | None, dashed: bool = False) -> None:
    if curve is None or not len(curve):
        return
    ax.plot(curve.steps, curve.values, color=color, linestyle="--" if dashed else "-", linewidth=1.2, label=label)


def _robust_log_y(ax: Axes) -> None:
    """Losses on a log axis whose limits hold the bulk of the curves (Tukey's fences in log space),
    so one divergent trial cannot flatten the rest."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()] or [np.array([])])
    finite = values[np.isfinite(values)]
    if not len(finite) or finite.min() <= 0:
        return
    ax.set_yscale("log")
    ax.minorticks_off()
    limits = robust_range(finite, log=True)
    if limits is not None:
        ax.set_ylim(10 ** limits[0], 10 ** limits[1])


def _mark_checkpoints(ax: Axes, curve: Any, steps: list[int], color: str, mode: str) -> None:
    if curve is None or not len(curve):
        return
    finite = curve.finite()
    if len(finite):
        b = int(np.argmin(finite.values) if mode == "min" else np.argmax(finite.values))
        ax.scatter([finite.steps[b]], [finite.values[b]], marker="*", s=120, color=color, edgecolor="black", zorder=5)
    if steps:
        ys = np.interp(steps, finite.steps, finite.values) if len(finite) else np.zeros(len(steps))
        ax.scatter(steps, ys, marker="|", s=160, color=color, zorder=4)


# --- grad_norm --------------------------------------------------------------------------------


def grad_norm_plot(data: dict[str, Any]) -> Figure:
    """The unclipped gradient norm against step and its histogram over all steps, for the best
    trial of each arm, with the 90th percentile (playbook: a clipping threshold to start from)."""
    fig = _figure(WIDTH, 4.4)
    step_ax, hist_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    own = data.get("grad_metric") or "train/grad_norm"
    _title(fig, data, "train/grad_norm (unclipped)" + (f", reported as {own}" if own != "train/grad_norm" else ""))
    drawn = False
    for i, entry in enumerate(data["entries"]):
        curve, color = entry.get("curve"), COLORS[i % len(COLORS)]
        if curve is None or not len(curve.finite()):
            continue
        finite = curve.finite()
        drawn = True
        step_ax.plot(finite.steps, finite.values, color=color, linewidth=0.9, label=entry["label"])
        positive = finite.values[finite.values > 0]
        bins = np.geomspace(positive.min(), positive.max() * 1.0001, 40).tolist() if len(positive) > 1 else 20
        hist_ax.hist(positive if len(positive) else finite.values, bins=bins, color=color, alpha=0.5)
        if entry.get("p90") is not None:
            for ax in (hist_ax,):
                ax.axvline(entry["p90"], color=color, linestyle="--", label=f"p90 = {entry['p90']:.3g}")
            step_ax.axhline(entry["p90"], color=color, linestyle="--", linewidth=0.8)
    if not drawn:
        missing = (data.get("missing") or {}).get("message") or "no train/grad_norm reported"
        _empty(step_ax, missing.replace(": ", ":\n", 1))
        return fig
    step_ax.set_yscale("log")
    hist_ax.set_xscale("log")
    step_ax.minorticks_off()
    hist_ax.minorticks_off()
    step_ax.set_xlabel("step", fontsize=LABEL)
    hist_ax.set_xlabel("gradient norm", fontsize=LABEL)
    step_ax.legend(fontsize=LEGEND)
    hist_ax.legend(fontsize=LEGEND)
    return fig


# --- best_steps -------------------------------------------------------------------------------


def best_steps_plot(data: dict[str, Any]) -> Figure:
    """Where retrospective checkpoint selection finds each trial's best step, as a share of
    max_train_steps; the first 10% and last 25% shaded (the playbook's thresholds)."""
    summary = data["summary"]
    fig = _figure(WIDTH, 3.8)
    ax = fig.add_subplot()
    _title(fig, data, f"best steps (max_train_steps = {summary['max_train_steps']})")
    fractions = summary["best_step_fractions"]
    if not fractions:
        _empty(ax, "no completed trials yet")
        return fig
    bins = np.linspace(0, 1, 21).tolist()
    ax.axvspan(0, 0.1, color=INFEASIBLE, alpha=0.08)
    ax.axvspan(0.75, 1.0, color=COLORS[0], alpha=0.08)
    ax.hist(np.clip(fractions, 0, 1), bins=bins, color="#bbb", label="all trials")
    if summary["top"]:
        ax.hist(np.clip(summary["top"]["fractions"], 0, 1), bins=bins, color=COLORS[0], label="best trials")
    ax.set_xlabel("best step / max_train_steps", fontsize=LABEL)
    ax.set_ylabel("trials", fontsize=LABEL)
    ax.legend(fontsize=LEGEND)
    return fig


# --- budget -----------------------------------------------------------------------------------


def budget_plot(data: dict[str, Any]) -> Figure:
    """Figure 3: box plots of the best of k trials drawn from the study, for k = 1…N (boxes at
    the quartiles, whiskers at the 5th and 95th percentiles, the expected best as a line)."""
    series = data["series"]
    fig, axes = _grid(len(series), height=3.8)
    _title(fig, data, f"best {data['metric']} of k trials (bootstrap)")
    if not series:
        _empty(axes[0], "no finished trials yet")
    for ax, s in zip(axes, series, strict=False):
        _budget_panel(ax, {**s, "mode": data["mode"]}, data["metric"])
    return fig


def _budget_panel(ax: Axes, s: dict[str, Any], metric: str) -> None:
    stats: list[dict[str, Any]] = []
    finite = [v for key in ("p5", "p95") for v in s[key] if v is not None]
    worst = (max(finite) if s.get("mode", "min") == "min" else min(finite)) if finite else None
    for i, k in enumerate(s["k"]):
        # a quantile that falls on an infeasible draw is drawn at the worst feasible value
        box = [worst if v is None else v for v in (s[q][i] for q in ("p5", "p25", "median", "p75", "p95"))]
        if any(v is None for v in box):
            continue
        stats.append(
            {
                "label": str(k),
                "whislo": box[0],
                "q1": box[1],
                "med": box[2],
                "q3": box[3],
                "whishi": box[4],
                "fliers": [],
            }
        )
    if not stats:
        _empty(ax, "too few feasible trials")
        return
    positions = list(range(len(stats)))
    ax.bxp(stats, positions=positions, showfliers=False, widths=0.6)
    means = [s["mean"][s["k"].index(int(b["label"]))] for b in stats]
    ax.plot(positions, means, color=COLORS[1], linewidth=1, label="expected best")
    step = max(1, len(stats) // 12)
    ax.set_xticks(positions[::step], [b["label"] for b in stats][::step], fontsize=LEGEND)
    ax.set_xlabel("number of trials k", fontsize=LABEL)
    ax.set_ylabel(metric, fontsize=LABEL)
    flat = "flattened" if s.get("flattened") else "not flattened"
    ax.set_title(f"{s['label']} ({s['n']} trials, {flat})", fontsize=PANEL_TITLE)
    ax.legend(fontsize=LEGEND)


def _arm_name(arm: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(dict(arm).items())) or "trials"


_DRAW: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "axis": axis_plot,
    "isolation": isolation_plot,
    "curves": curves_plot,
    "grad_norm": grad_norm_plot,
    "best_steps": best_steps_plot,
    "budget": budget_plot,
}
