"""Every shipped search space validates, with the papers' grid sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.sweep.spec import grid_points, load_spec

pytestmark = pytest.mark.unit

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"
EXPECTED_TRIALS = {
    "quickstart": 8,
    "snli_wbw": 36,  # Rocktäschel §3: lr 3 x dropout 3 x ℓ2 4
    "snli_attention": 36,
    "snli_conditional": 108,  # three Table 1 rows x the §3 grid
    "snli_two_way": 72,
    "snli_decomposable": 6,  # vanilla and intra x batch size {4, 16, 32}
    "sick_abcnn": 72,  # BCNN, ABCNN-1/2/3 x 1/2 blocks x Table 2 lr and ℓ2 (w = 3)
    "snli_cam": 18,  # 3 variants x batch size 3 x ℓ2 2
    "scitail_cam": 18,
}


def test_every_space_is_listed():
    assert sorted(p.stem for p in SPACES.glob("*.yaml")) == sorted(EXPECTED_TRIALS)


@pytest.mark.parametrize("name", sorted(EXPECTED_TRIALS))
def test_space_validates_with_the_papers_grid(name):
    spec = load_spec(SPACES / f"{name}.yaml")
    assert spec.name == name
    assert spec.num_trials() == EXPECTED_TRIALS[name]
    points = grid_points(spec)
    assert len(points) == spec.grid_size()
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)  # no duplicates


def test_wbw_grid_is_rocktaschels():
    points = grid_points(load_spec(SPACES / "snli_wbw.yaml"))
    assert {p["lr"] for p in points} == {1e-4, 3e-4, 1e-3}
    assert {p["dropout"] for p in points} == {0.0, 0.1, 0.2}
    assert {p["l2"] for p in points} == {0.0, 1e-4, 3e-4, 1e-3}
