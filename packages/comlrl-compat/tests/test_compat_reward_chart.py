"""comlrl.trainers.preference._reward_chart: the SVG reward histograms of CoMLRL 1.4.3's
``log_reward_distribution`` (geometry read back from the markup)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from comlrl.trainers.preference._reward_chart import reward_chart_svg, tick_label
from comlrl.trainers.preference._reward_distribution import bin_edges, histogram
from hypothesis import given
from hypothesis import strategies as st

SVG = "{http://www.w3.org/2000/svg}"
counts_lists = st.lists(st.integers(0, 50), min_size=1, max_size=16)


def _svg(markup: str | None) -> ET.Element:
    assert markup is not None
    return ET.fromstring(markup)[0]


@given(counts_lists, counts_lists)
def test_bars_are_proportional_to_counts_and_inside_the_plot(a: list[int], b: list[int]) -> None:
    bins = min(len(a), len(b))
    series = [("target", np.array(a[:bins])), ("comparator", np.array(b[:bins]))]
    svg = _svg(
        reward_chart_svg(title="t", edges=np.linspace(0, 1, bins + 1), series=series, kind="bar")
    )
    bars = [r.attrib for r in svg.iter(f"{SVG}rect") if r.attrib.get("opacity")][: 2 * bins]
    peak = max(1, *a[:bins], *b[:bins])
    want = [48 * n / peak for pair in zip(a[:bins], b[:bins], strict=True) for n in pair]
    assert [float(r["height"]) for r in bars] == pytest.approx(want, abs=0.051)
    for r in bars:  # bottoms on the zero line, inside x = 29 .. 230
        assert float(r["y"]) + float(r["height"]) == pytest.approx(62, abs=0.1)
        assert 29 <= float(r["x"]) and float(r["x"]) + float(r["width"]) <= 230.1


@given(counts_lists)
def test_line_points_sit_on_the_bin_centres(counts: list[int]) -> None:
    edges = np.linspace(-1.0, 3.0, len(counts) + 1)
    svg = _svg(
        reward_chart_svg(title="t", edges=edges, series=[("x", np.array(counts))], kind="line")
    )
    (line,) = svg.iter(f"{SVG}polyline")
    points = [tuple(map(int, p.split(","))) for p in line.attrib["points"].split()]
    centres = (edges[:-1] + edges[1:]) / 2
    assert [x for x, _ in points] == [round(29 + (c + 1) / 4 * 201) for c in centres]
    peak = max(1, *counts)
    assert [y for _, y in points] == [round(62 - 48 * n / peak) for n in counts]
    assert line.attrib["stroke"] == "#2878d6"  # a series other than target/comparator


def test_labels_are_escaped_and_empty_series_left_out() -> None:
    markup = reward_chart_svg(
        title="a < b & c",
        edges=np.array([0.0, 1.0]),
        series=[("x&y", np.array([1])), ("absent", np.array([]))],
        kind="bar",
    )
    assert markup is not None and "a &lt; b &amp; c" in markup and "x&amp;y" in markup
    assert "absent" not in markup
    assert reward_chart_svg(title="t", edges=np.array([0.0, 1.0]), series=[], kind="line") is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "pie"}, "kind must be"),
        ({"edges": np.array([0.0])}, "at least two"),
        ({"series": [("t", np.array([1, 2, 3]))]}, "3 counts for 2 bins"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict, match: str) -> None:
    args = {
        "title": "t",
        "edges": np.array([0.0, 0.5, 1.0]),
        "series": [("t", np.array([1, 2]))],
        "kind": "bar",
    }
    with pytest.raises(ValueError, match=match):
        reward_chart_svg(**{**args, **kwargs})


@given(st.lists(st.floats(-10, 10, allow_nan=False), max_size=30))
def test_histogram_counts_every_reward_clipped_into_the_range(rewards: list[float]) -> None:
    edges = bin_edges(0.0, 1.0)
    counts = histogram(rewards, edges)
    assert counts.shape == (16,) and int(counts.sum()) == len(rewards)
    assert int(counts[0]) >= sum(r <= 0.0 for r in rewards)


@pytest.mark.parametrize(
    ("value", "label"), [(3.0, "3"), (-1.25, "-1.2"), (0.5, "0.50"), (0.01, "0.010")]
)
def test_tick_labels(value: float, label: str) -> None:
    assert tick_label(value) == label
