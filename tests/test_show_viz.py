"""terra_nb.workbook.show / viz / results / pitfalls: the notebook helpers."""
from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from terra_nb import FrameLayout
from terra_nb.port import layout as layout_mod
from terra_nb.workbook import viz
from terra_nb.port.layout import SEED_PLACEHOLDER, build_prompt
from terra_nb.lessons.pitfalls import (action_items, image_mask, merge_image_embeddings, reusable_prefix,
                               seed_image_mask)
from terra_nb.workbook.results import figure_path, load_results, markdown_table, record_result, result_to_markdown
from terra_nb.workbook.show import Source, environment_info, shapes_table, show_shapes, show_source, source_of

TERRA = FrameLayout()
TINY = FrameLayout(image_tokens=64, vocab_size=513)


# --------------------------------------------------------------------------- show


def test_show_source_returns_the_real_source(capsys):
    src = show_source(build_prompt)
    assert isinstance(src, Source)
    assert str(src) == inspect.getsource(layout_mod.build_prompt)
    assert src.file == "terra_nb/port/layout.py"
    assert src.line == inspect.getsourcelines(layout_mod.build_prompt)[1]
    # outside IPython it prints plain text with a header
    out = capsys.readouterr().out
    assert out.startswith("# terra_nb/port/layout.py:") and "def build_prompt(" in out


def test_source_of_resolves_names_methods_and_classes():
    assert source_of("terra_nb.port.layout:build_prompt") == inspect.getsource(layout_mod.build_prompt)
    assert source_of("terra_nb.port.layout.validate_prompt").startswith("def validate_prompt(")
    prop = source_of(FrameLayout.frame_len)  # a property: its getter
    assert "def frame_len(self)" in prop
    assert source_of(FrameLayout).startswith("@dataclass(frozen=True)\nclass FrameLayout")
    with pytest.raises(TypeError, match="no Python source"):
        source_of(len)


def test_source_renderings():
    src = source_of(build_prompt)
    html = src.to_html()
    assert "terra_nb/port/layout.py" in html and "<span" in html  # highlighted
    md = src.to_markdown()
    assert "```python\ndef build_prompt(" in md and md.rstrip().endswith("```")
    assert src._ipython_display_() is None  # the return value never echoes a second copy


def test_shapes_table_and_show_shapes(capsys):
    ids = torch.arange(12).view(3, 4)
    table = shapes_table(values=3, ids=ids, kw={"actions": torch.zeros(2, 6, 3)}, n=5, xs=[1, 2])
    lines = table.splitlines()
    assert lines[0].split() == ["name", "type", "shape", "dtype", "values"]
    assert lines[2].split()[:4] == ["ids", "Tensor", "[3,", "4]"] and "0, 1, 2, ..." in lines[2]
    assert "kw.actions" in lines[3] and "[2, 6, 3]" in lines[3] and "float32" in lines[3]
    assert lines[4].split() == ["n", "int", "5"]
    assert "len 2" in lines[5]
    show_shapes(ids=ids)
    assert capsys.readouterr().out.splitlines()[2].split() == ["ids", "Tensor", "[3,", "4]", "int64"]


def test_shapes_table_keeps_small_values_and_text_table_rounds_to_cents():
    """The two tables format numbers differently, each its own way: a traced value to 4
    significant digits (a 0.00123 step size must not read "0.00"), a results cell to 2 places."""
    from terra_nb.workbook.show import text_table

    row = shapes_table(values=3, x=torch.tensor([0.00123, 3.0333, -250.5], dtype=torch.float64)).splitlines()[2]
    assert row.split("float64")[1].strip() == "0.00123, 3.033, -250.5"
    assert shapes_table(n=0.00123).splitlines()[2].split() == ["n", "float"]  # no values column asked
    assert shapes_table(values=1, n=0.00123).splitlines()[2].split() == ["n", "float", "0.00123"]
    table = text_table([{"ms": 0.00123, "tokens": 12345, "ratio": 1234.5}]).splitlines()
    assert table[2].split() == ["0.00", "12,345", "1,234.50"]


def test_environment_info():
    env = environment_info("cpu")
    assert env["device_type"] == "cpu" and env["device"]
    assert env["torch"] == torch.__version__
    assert env["python"].count(".") == 2 and env["transformers"]
    assert "UTC" in env["date"]
    json.dumps(env)  # goes into result files


# --------------------------------------------------------------------------- viz


@pytest.mark.parametrize("layout,n,total", [(TERRA, 3, 1746), (TINY, 2, 140)])
def test_plot_token_layout(tmp_path, layout, n, total):
    png = tmp_path / "fig" / "layout.png"
    fig = viz.plot_token_layout(layout, n_frames=n, save=png)
    assert isinstance(fig, Figure)
    assert tuple(fig.get_size_inches()) == (12, 5.4)
    titles = " ".join(ax.get_title() + ax.get_title("left") for ax in fig.get_axes())
    assert f"= {total} tokens" in titles
    assert str(layout.placeholder_id) in " ".join(t.get_text() for ax in fig.get_axes() for t in ax.texts)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_image_grid():
    assert viz.image_grid(576) == (18, 32) == viz.image_grid(TERRA)
    assert viz.image_grid(64) == (8, 8)


def test_codes_to_image_deterministic_and_injective():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 262144, (576,), generator=g)
    a, b = viz.codes_to_image(codes), viz.codes_to_image(codes.clone())
    assert a.shape == (18, 32, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    # every id of Terra's vocabulary gets its own colour
    colors = viz.code_colors(np.arange(262145))
    assert len(np.unique(colors.astype(np.int64) @ np.array([1 << 16, 1 << 8, 1]))) == 262145
    # neighbouring ids are far apart in colour
    assert np.abs(colors[0].astype(int) - colors[1].astype(int)).sum() > 60
    # the grid follows the pixels: code at (r, c) is colour of codes[r * 32 + c]
    assert np.array_equal(a[2, 5], viz.code_colors(codes[2 * 32 + 5]))
    with pytest.raises(ValueError, match="grid"):
        viz.codes_to_image(codes, grid=(10, 10))
    with pytest.raises(ValueError, match="placeholders"):
        viz.codes_to_image(torch.full((576,), SEED_PLACEHOLDER))


def test_frames_strip(tmp_path):
    frames = torch.randint(0, 512, (4, 64))
    other = frames.clone()
    other[2, 10] = (other[2, 10] + 1) % 512
    fig = viz.frames_strip({"hf": frames, "vllm": other}, TINY, diff=True, save=tmp_path / "s.png")
    assert isinstance(fig, Figure)
    assert fig.get_size_inches()[0] == pytest.approx(2.2 * 4 + 0.8)
    shown = [ax for ax in fig.get_axes() if ax.images]
    assert len(shown) == 12  # 2 rollouts + the difference row, 4 frames each
    diff_row = [ax for ax in shown if ax.get_title().startswith("differs")]
    red = [int((ax.images[0].get_array()[..., 0] == 214).sum()) for ax in diff_row]
    assert red == [0, 0, 1, 0]
    assert (tmp_path / "s.png").exists()
    wide = viz.frames_strip(torch.randint(0, 512, (10, 64)), max_cols=4)  # wraps onto 3 rows
    assert len([ax for ax in wide.get_axes() if ax.images]) == 10
    assert wide.get_size_inches()[0] == pytest.approx(2.2 * 4 + 0.8)


def test_frame_viewer_scrubs_headless():
    frames = torch.randint(0, 512, (5, 64))
    w = viz.frame_viewer({"hf": frames, "vllm": frames[:3]})
    assert w.slider.max == 4
    first = w.images["hf"].value
    w.slider.value = 3
    assert w.images["hf"].value != first
    assert w.images["hf"].value[:4] == b"\x89PNG"
    assert w.images["vllm"].value == viz._png(np.full((8, 8, 3), 200, np.uint8), 8)  # past its end: blank


def test_bar_chart_benchmark(tmp_path):
    rows = [
        {"name": "hf", "batch": 1, "s_per_frame": 8.5},
        {"name": "vllm", "batch": 1, "s_per_frame": 0.98, "frames_per_s": 1.02},
        {"name": "vllm_b32", "batch": 32, "s_per_frame": 1.51, "frames_per_s": 21.2},
    ]
    fig = viz.bar_chart_benchmark(rows, note="H200", save=tmp_path / "b.png")
    (ax,) = fig.get_axes()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["seed: HF generate", "seed: vLLM 0.6 (enforce_eager)", "hf", "vllm", "vllm_b32 (batch 32)"]
    assert fig.get_size_inches()[1] == pytest.approx(0.45 * 5 + 1.6)
    assert "H200" in ax.get_title() and ax.get_xscale() == "linear"
    assert any("11.03 s" in t.get_text() for t in ax.texts)
    only_ours = viz.bar_chart_benchmark([{"name": "a", "s_per_frame": 100.0}, {"name": "b", "s_per_frame": 1.0}],
                                        seed_figures=None)
    assert len(only_ours.get_axes()[0].get_yticklabels()) == 2
    assert only_ours.get_axes()[0].get_xscale() == "log"
    with pytest.raises(ValueError):
        viz.bar_chart_benchmark([], seed_figures=None)


# --------------------------------------------------------------------------- results


def test_record_and_render_results(tmp_path):
    assert record_result("x", {"a": 1}, None) is None and figure_path(None, "f") is None
    assert figure_path(tmp_path, "f") == tmp_path / "figures" / "f.png"
    p = record_result("06_parity", {
        "title": "Parity", "note": "greedy", "frames": 3, "identical": True,
        "max_abs": torch.tensor(1.5e-6), "versions": {"torch": "2.13"},
        "rows": [{"name": "v1", "tokens": 192}, {"name": "v2", "tokens": 192, "extra": 1}],
    }, tmp_path)
    assert p == tmp_path / "results" / "06_parity.json"
    data = load_results(tmp_path)["06_parity"]
    assert data["max_abs"] == pytest.approx(1.5e-6)
    md = result_to_markdown("06_parity", data)
    assert md.startswith("### Parity\n\ngreedy")
    assert "| frames | 3 |" in md and "| versions.torch | 2.13 |" in md and "| max_abs | 1.5e-06 |" in md
    assert "| name | tokens | extra |\n|---|---|---|\n| v1 | 192 |  |\n| v2 | 192 | 1 |" in md
    with pytest.raises(ValueError):
        record_result("../x", {}, tmp_path)
    assert markdown_table([{"a": "x|y"}]) == "| a |\n|---|\n| x\\|y |"


# --------------------------------------------------------------------------- pitfalls


def test_seed_mask_drops_code_zero():
    ids = torch.tensor([5, 0, 2, -3, -3, 0, 7])
    table = torch.arange(1.0, 25).view(8, 3)
    seed = merge_image_embeddings(ids, table, seed_image_mask(ids))
    fixed = merge_image_embeddings(ids, table, image_mask(ids, 8))
    assert torch.equal(seed[1], torch.zeros(3)) and torch.equal(fixed[1], table[0])
    assert torch.equal(fixed[[0, 2, 6]], seed[[0, 2, 6]])
    assert not image_mask(torch.tensor([8, -3]), 8).any()  # the in-vocabulary placeholder too


def test_per_frame_items_keep_the_prefix_cache():
    a = torch.randn(6, 6, 3)
    codes = torch.arange(6 * 576).view(6, 576)
    old = build_prompt(codes[:3], TERRA) + codes[3].tolist()
    new = build_prompt(codes[:4], TERRA)
    per = reusable_prefix(old, action_items(a[:3], TERRA), new, action_items(a[:4], TERRA))
    one = reusable_prefix(old, action_items(a[:3], TERRA, False), new, action_items(a[:4], TERRA, False))
    assert per == 3 * 582 + 576 and one == 576
    assert reusable_prefix(old, action_items(a[:3], TERRA), new, action_items(a[:4], TERRA), 16) == 2320
    changed = a.clone()
    changed[1, 0, 0] += 1  # frame 1's actions differ: reuse stops at its first slot
    assert reusable_prefix(old, action_items(a[:3], TERRA), new, action_items(changed[:4], TERRA)) == 582 + 576
