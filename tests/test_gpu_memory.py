"""A trial's GPU memory: the need measured on the meta device, the cap a packed trial sets, and
what `orchestrate validate` prints for a spec that packs trials on GPUs."""

from __future__ import annotations

import pytest
import torch
from testkit.cli import orchestrate
from testkit.specs import QUICKSTART_PATH

from nli_models.registry import build_model, paper_configs
from nli_models.training.gpu_memory import OPTIMIZER_STATES, cap_memory, training_step_memory

SLURM_GPU_NODE = ("--slurm-nodes", "1", "--slurm-cpus-per-task", "2", "--slurm-gpus-per-node", "1")


def _paper_model(name: str):
    paper = next(p for p in paper_configs() if p.model == name)
    torch.manual_seed(0)
    return build_model(paper.model, vocab_size=5_000, **paper.config)


@pytest.mark.parametrize("model", ["rocktaschel", "decomposable", "abcnn", "cam"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZER_STATES))
def test_the_need_counts_weights_gradients_state_and_activations(model, optimizer):
    small, large = (training_step_memory(_paper_model(model), optimizer, batch, 30, 20) for batch in (32, 128))
    trained = sum(p.numel() * 4 for p in _paper_model(model).parameters() if p.requires_grad)
    assert small.gradients == trained and small.optimizer_state == OPTIMIZER_STATES[optimizer] * trained
    assert small.parameters >= trained and large.parameters == small.parameters
    # Activations are mostly per pair: four times the batch, up to four times the bytes (a few
    # saved tensors, e.g. the embedding rows of the batch's words, grow more slowly).
    assert small.saved_activations > 0
    assert 3.0 < large.saved_activations / small.saved_activations <= 4.0
    longer = training_step_memory(_paper_model(model), optimizer, 32, 60, 40)
    assert longer.saved_activations > small.saved_activations


def test_frozen_embeddings_need_no_gradient_or_state():
    model = _paper_model("decomposable")
    model.word_embeddings.requires_grad_(False)
    need = training_step_memory(model, "adam", 32, 20, 10)
    trained = sum(p.numel() * 4 for n, p in _paper_model("decomposable").named_parameters()
                  if not n.startswith("word_embeddings"))
    assert need.gradients == trained and need.parameters > 4 * trained  # the 5,000 x 300 table


def test_a_packed_trial_caps_its_process_at_its_share(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: calls.append(a))
    cap_memory(torch.device("cuda", 1), 0.25)
    for device, share in [(torch.device("cpu"), 0.25), (torch.device("cuda", 0), 0.0),
                          (torch.device("cuda", 0), 1.0), (torch.device("cuda", 0), 2.0)]:
        cap_memory(device, share)
    assert calls == [(0.25, 1)]


def test_validate_says_how_many_trials_fit_a_gpu_and_whether_the_share_holds_one(tmp_path):
    done = orchestrate("validate", str(QUICKSTART_PATH), "--set", "search.resources.gpu=0.125",
                       *SLURM_GPU_NODE, cwd=tmp_path)
    assert done.returncode == 0, done.output
    assert "GPU memory per trial:" in done.stdout and "trials fit" in done.stdout
    assert "resources.gpu 0.125 packs 8 trials per GPU" in done.stdout and ": fits" in done.stdout
    tiny_share = orchestrate("validate", str(QUICKSTART_PATH), "--set", "search.resources.gpu=0.001",
                             *SLURM_GPU_NODE, cwd=tmp_path)
    assert tiny_share.returncode == 0, tiny_share.output
    assert "packs 1000 trials per GPU" in tiny_share.stdout and "TOO SMALL" in tiny_share.stdout
    cpu_only = orchestrate("validate", str(QUICKSTART_PATH), cwd=tmp_path)
    assert cpu_only.returncode == 0 and "GPU memory per trial" not in cpu_only.stdout
