"""A small deterministic sample: context frames of image codes and a planned trajectory of actions.

`load_sample(preset)` returns `Sample(context [3, P] int64, actions [47, 6, 3] float32)`:

* `context`: 3 frames of codes drawn as a crude road scene (sky, horizon, road with a lane
  marking that moves towards the camera from frame to frame) on the preset's code grid
  (tiny: 8x8 of 512 codes, terra: 18x32 of 262144). The tiny context contains code 0.
* `actions`: one row per frame of a 47-frame video (3 context + 44 generated, the public
  generator's length); row `f` holds the 6 waypoints `(x, y, t)` planned at frame `f`:
  `t = 0, 0.5, ..., 2.5` s, `x` metres ahead (increasing), `y` a small lateral offset.
  Row `f` follows frame `f` in the token sequence.

The tiny sample and the trajectory are stored in `data/sample.json`; the terra context (3 x 576
codes) is computed by the same function at load time to keep the repository small.
`python -m terra_nb.workbook.data` rewrites `data/sample.json` and `data/configs/*.json`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from terra_nb.workbook.checkpoints import preset_config, preset_config_dict
from terra_nb.port.layout import FrameLayout

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
SAMPLE_FILE = DATA_DIR / "sample.json"
N_CONTEXT = 3
N_TRAJECTORY = 47


@dataclass(frozen=True)
class Sample:
    """Context frames `[n_ctx, P]` (int64 codes) and actions `[T, 6, 3]` (float32), frame-aligned."""

    preset: str
    context: torch.Tensor
    actions: torch.Tensor

    @property
    def layout(self) -> FrameLayout:
        return FrameLayout.from_config(preset_config(self.preset))


def scene_codes(layout: FrameLayout, n_frames: int = N_CONTEXT) -> torch.Tensor:
    """Deterministic road-scene codes `[n_frames, P]` on the layout's grid (no RNG involved)."""
    rows, cols = layout.grid_shape
    n = layout.num_codes
    out = torch.empty(n_frames, rows, cols, dtype=torch.long)
    horizon = rows // 3
    for f in range(n_frames):
        for r in range(rows):
            for c in range(cols):
                if r < horizon:  # sky: a gentle gradient in the upper half of the code book
                    v = n // 2 + (r * cols + c) * 7 % (n // 4)
                else:
                    depth = r - horizon + 1  # nearer rows are wider
                    centre = cols / 2
                    half = 0.5 + depth * (cols / 2) / (rows - horizon)
                    if abs(c + 0.5 - centre) <= half:
                        # road: code 0 on the lane marking, which moves down one row per frame
                        marking = abs(c + 0.5 - centre) < 0.75 and (r + f) % 3 == 0
                        v = 0 if marking else 1 + (r * 13 + c * 5 + f) % 31
                    else:  # roadside
                        v = n // 4 + (r * 17 + c * 11 + 3 * f) % (n // 8)
                out[f, r, c] = v
    return out.reshape(n_frames, rows * cols)


def trajectory(n_frames: int = N_TRAJECTORY, action_tokens: int = 6) -> torch.Tensor:
    """Planned waypoints `[n_frames, action_tokens, 3]`: (x ahead, y lateral, t seconds), rounded to mm."""
    rows = []
    for f in range(n_frames):
        speed = 6.0 + 2.0 * math.sin(f / 12.0)  # m/s
        curvature = 0.01 * math.sin(f / 9.0)  # 1/m, gentle left and right bends
        wp = []
        for k in range(action_tokens):
            t = 0.5 * k
            x = speed * t + 0.1 * t * t
            wp.append([round(x, 3), round(0.5 * curvature * x * x, 3), t])
        rows.append(wp)
    return torch.tensor(rows, dtype=torch.float32)


def build_sample_json() -> dict:
    """What `data/sample.json` holds (tests check that the file matches)."""
    tiny = FrameLayout.from_config(preset_config("tiny"))
    return {
        "about": "terra_nb sample: context codes of the tiny preset and a 47-frame trajectory; see terra_nb/workbook/data.py",
        "trajectory": trajectory().tolist(),
        "tiny": {"context": scene_codes(tiny).tolist()},
    }


def load_sample(preset: str = "tiny") -> Sample:
    """The sample for a preset ('tiny' or 'terra')."""
    data = json.loads(SAMPLE_FILE.read_text())
    layout = FrameLayout.from_config(preset_config(preset))
    if preset in data:
        context = torch.tensor(data[preset]["context"], dtype=torch.long)
    else:
        context = scene_codes(layout)
    actions = torch.tensor(data["trajectory"], dtype=torch.float32)
    return Sample(preset=preset, context=context, actions=actions)


def write_data_files(data_dir: Path = DATA_DIR) -> None:
    """Rewrite `data/sample.json` and `data/configs/{tiny,terra}.json` from the code."""
    (data_dir / "configs").mkdir(parents=True, exist_ok=True)
    for name in ("tiny", "terra"):
        (data_dir / "configs" / f"{name}.json").write_text(json.dumps(preset_config_dict(name), indent=2) + "\n")
    s = build_sample_json()
    # one frame per line keeps the file readable and diffable
    lines = ['{', f'  "about": {json.dumps(s["about"])},', '  "tiny": {"context": [']
    ctx = s["tiny"]["context"]
    lines += [f"    {json.dumps(row)}" + ("," if i < len(ctx) - 1 else "") for i, row in enumerate(ctx)]
    lines += ['  ]},', '  "trajectory": [']
    tr = s["trajectory"]
    lines += [f"    {json.dumps(row)}" + ("," if i < len(tr) - 1 else "") for i, row in enumerate(tr)]
    lines += ['  ]', '}']
    (data_dir / "sample.json").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write_data_files()
    print(f"wrote {SAMPLE_FILE} and {DATA_DIR / 'configs'}")
