"""Every paper configuration builds, and its |θ|M matches the published table within 2% — or,
where the paper's equations cannot give the published number, equals our documented count."""

from __future__ import annotations

import pytest

from nli_models import build_model, count_parameters, paper_configs

pytestmark = pytest.mark.unit

TOLERANCE = 0.02
CONFIGS = paper_configs()


def test_every_model_declares_paper_configs():
    assert {config.model for config in CONFIGS} == {"rocktaschel", "decomposable", "abcnn", "cam"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.model}: {c.table_row}")
def test_paper_config_parameter_count(config):
    model = build_model(config.model, vocab_size=50, **config.config)
    theta_m, theta_wm = count_parameters(model)
    assert theta_m > 0
    assert theta_wm == theta_m + 50 * config.config["embedding_dim"]
    expected = config.extra.get("expected_theta_m")
    if expected is not None:
        # A documented deviation: pinned exactly, and the notes must say how far off it is.
        assert theta_m == expected
        assert config.notes and f"{expected / config.published_theta_m - 1:+.1%}" in config.notes
    elif config.published_theta_m is not None:
        assert abs(theta_m / config.published_theta_m - 1) <= TOLERANCE, (
            f"|θ|M = {theta_m}, published {config.published_theta_m}"
        )
