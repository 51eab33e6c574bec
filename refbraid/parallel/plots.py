"""Figures of the parallel execution. Each function returns a matplotlib ``Figure`` (built with
``matplotlib.figure.Figure``, no pyplot state, never shown).

=============  ==================================================================
function       shows
=============  ==================================================================
plot_timeline  one row per rank over time: step applications coloured by level
               (blues forward, oranges adjoint; darker = finer), waiting for a
               message grey and hatched, collectives purple; the critical path
               drawn on top in red
=============  ==================================================================

Works for measured traces (:func:`refbraid.parallel.comm.run_traced`) and virtual ones
(:func:`refbraid.parallel.virtual.simulate`). Touching boxes of one kind on one rank are
merged before drawing, so traces of 10⁵ events draw in a second.

Shape legend: P ranks, E events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .trace import RECV, STEP, Event, Trace

#: Colours of the non-step kinds.
WAIT_COLOUR, COLLECTIVE_COLOUR, PATH_COLOUR = "0.8", "tab:purple", "red"
#: Row height (fraction of the distance between ranks).
ROW = 0.8


def _step_colour(level: int, direction: str, n_levels: int):
    cmap = colormaps["Blues" if direction == "forward" else "Oranges"]
    shade = 0.9 - 0.55 * (level / max(n_levels - 1, 1))  # finest darkest
    return cmap(shade)


def _category(e: Event) -> tuple | None:
    if e.kind == STEP:
        return ("step", e.direction, e.level)
    if e.kind == RECV:
        return ("wait",)
    if e.is_collective:
        return ("collective",)
    return None  # a send: zero duration, not drawn


def _merged_boxes(events: Sequence[Event]) -> dict[tuple, list[tuple[int, float, float]]]:
    """``{category: [(rank, t0, t1), ...]}`` with touching boxes of one category merged."""
    out: dict[tuple, list[list]] = defaultdict(list)
    last: dict[int, tuple[tuple, list]] = {}
    for e in events:
        cat = _category(e)
        if cat is None or e.t1 <= e.t0:
            continue
        prev = last.get(e.rank)
        if prev is not None and prev[0] == cat and prev[1][2] == e.t0:
            prev[1][2] = e.t1
            continue
        box = [e.rank, e.t0, e.t1]
        out[cat].append(box)
        last[e.rank] = (cat, box)
    return {k: [tuple(b) for b in v] for k, v in out.items()}


def _rectangles(boxes, row_of: dict[int, int], height: float,
                x=lambda t: t) -> np.ndarray:
    """(n, 4, 2) corner arrays of the boxes ``(rank, t0, t1)``, times through ``x``."""
    v = np.empty((len(boxes), 4, 2))
    for j, (r, t0, t1) in enumerate(boxes):
        y, x0, x1 = row_of[r], x(t0), x(t1)
        v[j] = [(x0, y - height / 2), (x1, y - height / 2), (x1, y + height / 2),
                (x0, y + height / 2)]
    return v


def _time_axis(t_range: tuple[float, float], unit: str):
    """(x(t), axis label, shown range): times in seconds from the window's start, in ms or µs
    when the window is short (a 20 ms step reads 0–20 ms, not 0.00025–0.0199 s)."""
    start, end = t_range
    scale, shown = 1.0, unit
    if unit == "s" and end - start < 1e-3:
        scale, shown = 1e6, "µs"
    elif unit == "s" and end - start < 1.0:
        scale, shown = 1e3, "ms"
    label = f"time ({shown})" if start == 0 else f"time from the window's start ({shown})"
    return (lambda t: (t - start) * scale), label, (0.0, (end - start) * scale)


def plot_timeline(trace: Trace, critical_path: Sequence[Event] | None = None, *,
                  ranks: Sequence[int] | None = None, t_range: tuple[float, float] | None = None,
                  title: str | None = None, time_unit: str = "s") -> Figure:
    """Timeline of ``trace``: one row per rank (rank 0 on top), time along x.

    critical_path  events to highlight (e.g. ``VirtualRun.critical_path``): red bars over
                   the events and red links where the path jumps between ranks
    ranks          the ranks to show (default all)
    t_range        the time window to show (default the whole trace), drawn from 0
    time_unit      unit of the trace's times (``'s'``: drawn in ms or µs when the window is
                   short; or e.g. ``'step costs'`` for unit costs)
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"`trace` must be a refbraid.parallel.trace.Trace, got "
                        f"{type(trace).__name__}.")
    shown = list(trace.ranks if ranks is None else ranks)
    missing = sorted(set(shown) - set(trace.ranks))
    if missing:
        raise ValueError(f"`ranks` {missing[:8]} have no events in the trace "
                         f"(it has ranks {trace.ranks[:8]}...).")
    row_of = {r: i for i, r in enumerate(shown)}
    events = [e for e in trace.events if e.rank in row_of]
    n_levels = 1 + max((e.level for e in events if e.kind == STEP), default=0)

    t_end = max((e.t1 for e in events), default=1.0) or 1.0
    x, xlabel, xlim = _time_axis(t_range if t_range is not None else (0.0, t_end), time_unit)
    height = min(12.0, max(2.5, 0.9 + 0.28 * len(shown)))
    fig = Figure(figsize=(10, height), layout="constrained")
    ax = fig.add_subplot()
    handles = []
    boxes = _merged_boxes(events)
    order = sorted(boxes, key=lambda c: (c[0] != "step", c[1:] if c[0] == "step" else ()))
    for cat in order:
        verts = _rectangles(boxes[cat], row_of, ROW, x)
        if cat[0] == "step":
            colour = _step_colour(cat[2], cat[1], n_levels)
            kind = "forward" if cat[1] == "forward" else "adjoint"
            coll = PolyCollection(verts, facecolors=[colour], edgecolors="none")
            label = f"{kind} step, level {cat[2]}"
        elif cat[0] == "wait":
            coll = PolyCollection(verts, facecolors=[WAIT_COLOUR], edgecolors="0.5",
                                  linewidths=0.3, hatch="///")
            colour, label = WAIT_COLOUR, "waiting for a message"
        else:
            coll = PolyCollection(verts, facecolors=[COLLECTIVE_COLOUR], edgecolors="none")
            colour, label = COLLECTIVE_COLOUR, "collective (reduction)"
        ax.add_collection(coll)
        handles.append(Patch(facecolor=colour, edgecolor="0.5" if cat[0] == "wait" else "none",
                             hatch="///" if cat[0] == "wait" else None, label=label))

    if critical_path:
        _draw_path(ax, [e for e in critical_path if e.rank in row_of], row_of, x)
        handles.append(Patch(facecolor="none", edgecolor=PATH_COLOUR, lw=2,
                             label="critical path"))

    ax.set_xlim(*xlim)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    step = max(1, len(shown) // 16)
    ax.set_yticks(range(0, len(shown), step), [str(shown[i]) for i in range(0, len(shown), step)])
    ax.set_ylabel("rank")
    ax.set_xlabel(xlabel)
    ax.set_title(title or f"timeline of {len(shown)} rank(s), {len(events)} events")
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0)
    return fig


def _draw_path(ax, path: Sequence[Event], row_of: dict[int, int], x=lambda t: t) -> None:
    """Red bars over the path's events (touching ones merged) and red links where it
    changes rank (from the send, or the last arrival at a collective, to the next event)."""
    bars: list[list] = []
    links = []
    prev: Event | None = None
    for e in path:
        y = row_of[e.rank]
        if prev is not None and prev.rank != e.rank:
            links.append(((x(prev.t1), row_of[prev.rank]),
                          (x(e.t1 if e.kind == RECV else e.t0), y)))
        if e.t1 > e.t0 and e.kind != RECV:  # a late message is drawn as its link
            if bars and bars[-1][1][1] == y and bars[-1][1][0] == x(e.t0):
                bars[-1][1] = (x(e.t1), y)
            else:
                bars.append([(x(e.t0), y), (x(e.t1), y)])
        prev = e
    ax.add_collection(LineCollection(bars, colors=PATH_COLOUR, linewidths=2.0,
                                     capstyle="butt"))
    if links:
        ax.add_collection(LineCollection(links, colors=PATH_COLOUR, linewidths=1.0))
