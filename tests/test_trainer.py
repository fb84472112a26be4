"""The pure-PyTorch trainer on the generated toy corpus with tiny models (seconds in all).

Covers: seeding, exact checkpoint resume (dropout RNG included), early stopping, the optimizers
as the papers use them (ℓ2 on non-embedding parameters only, Adagrad's 0.1 accumulator, Adam's
betas), gradient clipping, frozen embedding rows, per-class accuracy, best-on-dev evaluation and
the error for a missing GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from testkit.processes import run_probe
from testkit.toy import TOY, decomposable, toy_run_config

from nli_models.config import ConfigError, RunConfig, validate_config
from nli_models.data import prepare_data
from nli_models.data.text import PAD_INDEX, UNK_INDEX
from nli_models.training import DeviceUnavailable, Trainer, make_trainer, resolve_device
from nli_models.training.metrics import Evaluation, class_accuracy, evaluate
from nli_models.training.optimizers import make_optimizer
from nli_models.training.trainer import build_for_data

DECOMPOSABLE = decomposable(dropout=0.3)
ROCKTASCHEL = {
    "name": "rocktaschel",
    "variant": "word_by_word",
    "args": {"embedding_dim": 12, "hidden_size": 12, "dropout": 0.3},
}
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def run_config(model=DECOMPOSABLE, data=TOY, **training) -> RunConfig:
    return toy_run_config(model, data, **training)


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def embedding(trainer: Trainer) -> torch.Tensor:
    return trainer.model.word_embeddings.full_weight().clone()


def metrics(history) -> list[tuple]:
    """Everything of an epoch's result except its wall time."""
    return [
        (r.epoch, r.train_loss, r.train_accuracy, r.dev_loss, r.dev_accuracy, r.is_best)
        for r in history
    ]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def script_dev_accuracy(trainer: Trainer, accuracies: list[float]) -> None:
    """Make the trainer see these dev accuracies, epoch by epoch (the real evaluation still
    runs, so losses and predictions are real)."""
    real = trainer.evaluate
    scripted = iter(accuracies)

    def evaluate_split(split: str) -> Evaluation:
        result = real(split)
        if split == "dev":
            result.accuracy = next(scripted)
        return result

    trainer.evaluate = evaluate_split


# -- seeding ------------------------------------------------------------------------------------


def test_same_seed_same_run_and_another_seed_differs(toy):
    def run(seed: int) -> Trainer:
        trainer = make_trainer(run_config(seed=seed), toy)
        trainer.fit()
        return trainer

    first, second, other = run(7), run(7), run(8)
    assert metrics(first.state.history) == metrics(second.state.history)
    assert len(first.state.history) == 3
    assert_same_weights(weights(first), weights(second))
    assert metrics(first.state.history) != metrics(other.state.history)
    assert not torch.equal(embedding(first), embedding(other))


# -- checkpoints -----------------------------------------------------------------------------


class Interrupted(Exception):
    pass


@pytest.mark.parametrize(
    ("model", "optimizer", "how"),
    [
        (DECOMPOSABLE, "adam", "interrupted"),
        (DECOMPOSABLE, "adagrad", "extended"),
        (ROCKTASCHEL, "adam", "interrupted"),
    ],
    ids=["decomposable-adam-interrupted", "decomposable-adagrad-extended", "rocktaschel-adam"],
)
def test_resume_equals_uninterrupted_training(toy, tmp_path, model, optimizer, how):
    """2 epochs + checkpoint, a new trainer loads it and trains to 4 == 4 epochs in one go.

    "interrupted": a 4-epoch run dies right after its epoch-2 checkpoint (as `orchestrate train
    --checkpoint-dir` saves one per epoch); "extended": a finished 2-epoch run is continued with
    epochs=4. Dropout 0.3 makes the result depend on the restored torch RNG state."""
    options = {"optimizer": optimizer, "lr": 0.02, "l2": 1e-4, "grad_clip": 5.0, "seed": 3}
    config = run_config(model, epochs=4, **options)

    full = make_trainer(config, toy)
    full.fit()

    if how == "interrupted":
        first = make_trainer(config, toy)

        def save_then_die(trainer: Trainer, result) -> None:
            trainer.save_checkpoint(tmp_path)
            if result.epoch == 2:
                raise Interrupted

        with pytest.raises(Interrupted):
            first.fit(save_then_die)
    else:
        first = make_trainer(run_config(model, epochs=2, **options), toy)
        first.fit()
        first.save_checkpoint(tmp_path)
    assert first.state.epoch == 2

    resumed = make_trainer(config, toy)
    resumed.load_checkpoint(tmp_path)
    assert resumed.state.epoch == 2
    resumed.fit()

    assert metrics(resumed.state.history) == metrics(full.state.history)
    assert [r.epoch for r in resumed.state.history] == [1, 2, 3, 4]
    assert_same_weights(weights(resumed), weights(full))
    for name in ("best_dev_accuracy", "best_train_accuracy", "best_epoch"):
        assert getattr(resumed.state, name) == getattr(full.state, name)
    assert resumed.state.epochs_without_improvement == full.state.epochs_without_improvement
    assert_same_weights(resumed.best_model_state, full.best_model_state)

    # The check has teeth: the same resume with the RNG state left as it was diverges (dropout).
    unrestored = make_trainer(config, toy)
    unrestored.load_checkpoint(tmp_path)
    torch.manual_seed(12345)
    unrestored.fit()
    assert metrics(unrestored.state.history) != metrics(full.state.history)


def test_a_checkpoint_with_the_word_vectors_in_a_group_of_their_own_resumes_exactly(toy, tmp_path):
    """Without ℓ2 the optimizer is one parameter group; a checkpoint saved when the word vectors
    had a group of their own loads in that layout and training goes on as in one run."""
    options = {"optimizer": "adam", "lr": 0.02, "l2": 0.0, "seed": 3}
    full = make_trainer(run_config(epochs=4, **options), toy)
    full.fit()
    assert len(full.optimizer.param_groups) == 1
    first = make_trainer(run_config(epochs=2, **options), toy)
    first.optimizer = make_optimizer(first.model, first.config, split_embeddings=True)
    assert len(first.optimizer.param_groups) == 2
    first.fit()
    first.save_checkpoint(tmp_path)
    resumed = make_trainer(run_config(epochs=4, **options), toy)
    resumed.load_checkpoint(tmp_path)
    resumed.fit()
    assert len(resumed.optimizer.param_groups) == 2
    assert metrics(resumed.state.history) == metrics(full.state.history)
    assert_same_weights(weights(resumed), weights(full))


def test_resume_of_a_finished_run_trains_nothing(toy, tmp_path):
    trainer = make_trainer(run_config(epochs=2), toy)
    trainer.fit()
    trainer.save_checkpoint(tmp_path)
    again = make_trainer(run_config(epochs=2), toy)
    again.load_checkpoint(tmp_path)
    before = weights(again)
    seen = []
    again.fit(lambda t, r: seen.append(r))
    assert seen == [] and again.state.epoch == 2
    assert_same_weights(weights(again), before)


# -- early stopping ------------------------------------------------------------------------------


def test_early_stopping_on_dev_accuracy_with_patience(toy):
    trainer = make_trainer(run_config(epochs=10, patience=2), toy)
    # 0.5 again is no improvement (strictly better is); 0.45 is worse.
    script_dev_accuracy(trainer, [0.4, 0.5, 0.5, 0.45, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])
    state = trainer.fit()
    assert [r.epoch for r in state.history] == [1, 2, 3, 4]
    assert [r.is_best for r in state.history] == [True, True, False, False]
    assert state.best_epoch == 2 and state.best_dev_accuracy == 0.5
    assert state.best_train_accuracy == state.history[1].train_accuracy
    assert trainer.should_stop()
    assert trainer.fit().epoch == 4  # fitting again does not restart a stopped run

    without = make_trainer(run_config(epochs=6), toy)
    script_dev_accuracy(without, [0.4, 0.5, 0.5, 0.45, 0.4, 0.3])
    assert len(without.fit().history) == 6


def test_early_stopping_when_dev_accuracy_stalls(toy):
    # lr 1e-9: the weights barely move, so dev accuracy never strictly improves after epoch 1.
    trainer = make_trainer(run_config(epochs=20, patience=3, lr=1e-9), toy)
    state = trainer.fit()
    assert len(state.history) == 4 < 20
    assert state.best_epoch == 1 and state.epochs_without_improvement == 3


# -- optimizers, ℓ2, clipping ------------------------------------------------------------------


def _groups(trainer: Trainer) -> tuple[dict, dict]:
    embedding_weight = trainer.model.word_embeddings.embedding.weight
    groups = trainer.optimizer.param_groups
    assert len(groups) == 2
    (embedding_group,) = [g for g in groups if any(p is embedding_weight for p in g["params"])]
    (network_group,) = [g for g in groups if g is not embedding_group]
    return embedding_group, network_group


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_l2_on_non_embedding_parameters_only_param_groups(toy, optimizer):
    trainer = make_trainer(run_config(optimizer=optimizer, l2=0.25, lr=0.03), toy)
    embedding_group, network_group = _groups(trainer)
    embedding_ids = {id(p) for p in trainer.model.word_embeddings.parameters() if p.requires_grad}
    assert {id(p) for p in embedding_group["params"]} == embedding_ids
    assert embedding_group["weight_decay"] == 0.0
    assert network_group["weight_decay"] == 0.25
    trainable = {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert {id(p) for p in network_group["params"]} == trainable - embedding_ids
    assert all(g["lr"] == 0.03 for g in (embedding_group, network_group))


def test_adam_betas_and_adagrad_initial_accumulator(toy):
    adam = make_trainer(run_config(optimizer="adam"), toy).optimizer
    assert isinstance(adam, torch.optim.Adam)
    assert all(g["betas"] == (0.9, 0.999) for g in adam.param_groups)
    assert all(not g.get("amsgrad") for g in adam.param_groups)

    trainer = make_trainer(run_config(optimizer="adagrad"), toy)
    adagrad = trainer.optimizer
    assert isinstance(adagrad, torch.optim.Adagrad)
    assert all(g["initial_accumulator_value"] == 0.1 for g in adagrad.param_groups)
    params = [p for g in adagrad.param_groups for p in g["params"]]
    assert len(params) == len([p for p in trainer.model.parameters() if p.requires_grad])
    for p in params:
        assert torch.equal(adagrad.state[p]["sum"], torch.full_like(p, 0.1))
    # After training, the padding row (never a gradient) still holds exactly the initial 0.1.
    trainer.fit()
    pad_sum = adagrad.state[trainer.model.word_embeddings.embedding.weight]["sum"][PAD_INDEX]
    assert torch.equal(pad_sum, torch.full_like(pad_sum, 0.1))


def test_adagrad_accumulator_zero_first_step_is_lr_times_sign(toy):
    """Duchi et al.'s Adagrad (Yin et al.): no initial accumulator, so a parameter's first
    update is lr * sign(gradient) whatever the gradient's size."""
    trainer = make_trainer(run_config(optimizer="adagrad", lr=0.09, adagrad_accumulator=0.0), toy)
    adagrad = trainer.optimizer
    assert all(g["initial_accumulator_value"] == 0.0 for g in adagrad.param_groups)
    params = [p for g in adagrad.param_groups for p in g["params"]]
    before = [p.detach().clone() for p in params]
    for p in params:
        # magnitudes from 1e-3 to 1 (far above Adagrad's eps), both signs
        p.grad = torch.randn_like(p).sign() * 10 ** (-3 * torch.rand_like(p))
    grads = [p.grad.clone() for p in params]
    adagrad.step()
    for p, old, grad in zip(params, before, grads, strict=True):
        torch.testing.assert_close(old - p.detach(), 0.09 * grad.sign(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_huge_l2_decays_the_network_but_not_the_embeddings(toy, optimizer):
    # <unk> never occurs in the toy train split, so its (trainable) row gets a zero gradient:
    # only weight decay could move it. The network's weights, decayed, shrink towards zero.
    assert not np.any(toy.splits["train"].premise_ids == UNK_INDEX)
    assert not np.any(toy.splits["train"].hypothesis_ids == UNK_INDEX)

    def train(l2: float) -> tuple[torch.Tensor, Trainer]:
        trainer = make_trainer(run_config(optimizer=optimizer, l2=l2, lr=0.05, epochs=2), toy)
        assert bool(trainer.model.word_embeddings.trainable_rows[UNK_INDEX])
        before = embedding(trainer)
        trainer.fit()
        return before, trainer

    before, decayed = train(l2=100.0)
    after = embedding(decayed)
    assert torch.equal(after[UNK_INDEX], before[UNK_INDEX])
    assert torch.count_nonzero(before[UNK_INDEX]) > 0
    assert not torch.equal(after, before)  # rows of train words do move

    _, plain = train(l2=0.0)
    for name in ("output.weight", "projection.weight"):
        shrunk = decayed.model.get_parameter(name).norm()
        assert shrunk < 0.5 * plain.model.get_parameter(name).norm(), name


def test_gradient_clipping_limits_the_gradient_norm(toy):
    def grad_norms(grad_clip: float | None) -> list[float]:
        trainer = make_trainer(run_config(grad_clip=grad_clip, epochs=1, lr=0.05), toy)
        norms: list[float] = []

        def record(optimizer, args, kwargs) -> None:
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        trainer.optimizer.register_step_pre_hook(record)
        trainer.fit()
        return norms

    unclipped = grad_norms(None)
    assert max(unclipped) > 0.05  # so that the bound below means something
    clipped = grad_norms(0.05)
    assert len(clipped) == len(unclipped) > 0
    assert max(clipped) <= 0.05 * (1 + 1e-4)
    # Steps whose norm was above the bound are scaled onto it, not below.
    assert max(clipped) > 0.05 * 0.99


# -- frozen embedding rows ----------------------------------------------------------------------


def _vectors_data(toy, tmp_path, dim: int, oov: str):
    """Toy data with a GloVe-format file that covers every other word of the vocabulary."""
    rng = np.random.default_rng(0)
    covered = toy.vocab.itos[2::2]
    lines = [f"{w} " + " ".join(f"{x:.5f}" for x in rng.normal(size=dim)) for w in covered]
    path = tmp_path / "vectors.txt"
    path.write_text("\n".join(lines) + "\n")
    data_config = {**TOY, "vectors": {"source": str(path), "oov": oov}}
    return data_config, prepare_data(data_config, cache_dir=tmp_path / "prepared")


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_frozen_embedding_rows_do_not_move_trainable_rows_do(toy, tmp_path, optimizer):
    data_config, data = _vectors_data(toy, tmp_path, dim=16, oov="train_oov")
    trainable = torch.from_numpy(data.embedding_trainable)
    assert 0 < int(trainable.sum()) < len(trainable) - 1 and not trainable[PAD_INDEX]
    # lr 0.01: at 0.05 Adam can kill every ReLU of this tiny model within an epoch (seen after a
    # change of dropout draws), and a dead network moves no row: the claim would not be tested.
    config = run_config(data=data_config, optimizer=optimizer, lr=0.01, l2=0.01, epochs=2)
    trainer = make_trainer(config, data)
    assert torch.equal(trainer.model.word_embeddings.trainable_rows, trainable)
    assert trainer.theta_wm - trainer.theta_m == int(trainable.sum()) * 16
    before = embedding(trainer)
    assert torch.equal(before, torch.from_numpy(data.embedding_weight))
    trainer.fit()
    after = embedding(trainer)

    assert torch.equal(after[~trainable], before[~trainable])
    in_train = np.zeros(len(data.vocab), dtype=bool)
    in_train[data.splits["train"].premise_ids] = True
    in_train[data.splits["train"].hypothesis_ids] = True
    moving = trainable & torch.from_numpy(in_train)
    assert int(moving.sum()) > 0
    changed = (after[moving] != before[moving]).any(dim=1)
    assert bool(changed.all()), "a trainable row of a train word did not move"


def test_all_rows_frozen_with_hashed_oov(toy, tmp_path):
    data_config, data = _vectors_data(toy, tmp_path, dim=16, oov="hashed_oov")
    assert not data.embedding_trainable.any()
    trainer = make_trainer(run_config(data=data_config, lr=0.05, epochs=2), data)
    assert trainer.theta_wm == trainer.theta_m
    before, network_before = embedding(trainer), trainer.model.output.weight.detach().clone()
    trainer.fit()
    assert torch.equal(embedding(trainer), before)
    assert not torch.equal(trainer.model.output.weight, network_before)
    assert trainer.model.word_embeddings.embedding.weight.grad is None  # no [V, D] gradient at all


def test_a_cpu_trainer_flushes_denormal_floats(toy):
    torch.set_flush_denormal(False)
    assert (torch.tensor([1e-39]) * 1.0).item() != 0.0
    make_trainer(run_config(), toy)
    assert (torch.tensor([1e-39]) * 1.0).item() == 0.0


# -- metrics ------------------------------------------------------------------------------------


def test_class_accuracy_on_a_hand_made_case():
    labels = ("entailment", "neutral", "contradiction", "other")
    gold = np.array([0, 0, 1, 1, 1, 2, 2, 0])
    predicted = np.array([0, 1, 1, 1, 0, 2, 0, 0])
    result = class_accuracy(gold, predicted, labels)
    assert list(result) == list(labels)
    assert result["entailment"] == pytest.approx(2 / 3)
    assert result["neutral"] == pytest.approx(2 / 3)
    assert result["contradiction"] == pytest.approx(1 / 2)
    assert math.isnan(result["other"])  # no gold example of the class: undefined, not 0 or 1


def test_evaluate_counts_every_example_once(toy):
    trainer = make_trainer(run_config(batch_size=7), toy)
    trainer.fit()
    result = trainer.evaluate("test")
    split = toy.splits["test"]
    assert np.array_equal(result.gold, split.labels)  # file order, every example once
    assert result.accuracy == pytest.approx(float(np.mean(result.predictions == split.labels)))
    counts = np.bincount(split.labels, minlength=len(toy.labels))
    weighted = sum(
        result.class_accuracy[label] * n for label, n in zip(toy.labels, counts, strict=True)
    )
    assert weighted / len(split) == pytest.approx(result.accuracy)


# -- best-on-dev evaluation ---------------------------------------------------------------------


def test_evaluate_best_uses_best_on_dev_weights_and_restores_current(toy):
    config = run_config(epochs=3, lr=0.05)
    trainer = make_trainer(config, toy)
    before_training = trainer.evaluate("test")
    assert trainer.evaluate_best("test").loss == before_training.loss  # no best yet: current

    script_dev_accuracy(trainer, [0.9, 0.1, 0.2])  # epoch 1 is the best on dev
    per_epoch: dict[int, dict[str, torch.Tensor]] = {}
    trainer.fit(lambda t, r: per_epoch.__setitem__(r.epoch, weights(t)))
    assert trainer.state.best_epoch == 1
    final = weights(trainer)
    assert_same_weights(final, per_epoch[3])

    best = trainer.evaluate_best("test")
    assert_same_weights(weights(trainer), final)  # the current weights are back

    reference = build_for_data(config, toy)
    reference.load_state_dict(per_epoch[1])
    expected = evaluate(
        reference, trainer._batches("test", shuffle=False), toy.labels, trainer.device
    )
    assert best.loss == pytest.approx(expected.loss, rel=1e-6)
    assert np.array_equal(best.predictions, expected.predictions)
    last = trainer.evaluate("test")
    assert not np.array_equal(last.predictions, best.predictions)  # the last weights differ


# -- devices ------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_clear_error(toy):
    with pytest.raises(DeviceUnavailable, match=r"training.device='cuda'.*CUDA is not available"):
        make_trainer(run_config(device="cuda"), toy)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")


def test_device_names_are_validated_in_the_config():
    with pytest.raises(ConfigError, match=r"run.yaml: training.device: .*'gpu'"):
        validate_config(
            RunConfig,
            {"name": "x", "model": DECOMPOSABLE, "data": TOY, "training": {"device": "gpu"}},
            "run.yaml",
        )


EVALUATE_ONLY = """
import sys
from testkit.toy import TOY, decomposable, toy_run_config
from nli_models.data import prepare_data
from nli_models.training import make_trainer
trainer = make_trainer(toy_run_config(decomposable(), TOY, epochs=1), prepare_data(TOY, cache_dir=sys.argv[2]))
trainer.load_checkpoint(sys.argv[1])
accuracy = trainer.evaluate_best("test").accuracy
print("torch._dynamo" in sys.modules, accuracy)
"""


def test_evaluating_saved_weights_builds_no_optimizer(toy, tmp_path):
    """A process that only evaluates a checkpoint (a sweep's test evaluation) never imports
    torch._dynamo, which building an optimizer or switching deterministic algorithms does (about
    1 s of CPU); the optimizer is built, with the checkpoint's state, when training needs it."""
    trainer = make_trainer(run_config(decomposable(), epochs=1), toy)
    trainer.fit()
    trainer.save_checkpoint(tmp_path / "checkpoint")
    expected = trainer.evaluate_best("test").accuracy
    done = run_probe(EVALUATE_ONLY, str(tmp_path / "checkpoint"), str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr[-2000:]
    imported, accuracy = done.stdout.split()
    assert imported == "False" and float(accuracy) == expected

    resumed = make_trainer(run_config(decomposable(), epochs=1), toy)
    resumed.load_checkpoint(tmp_path / "checkpoint")
    assert resumed.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys() != set()


FIRST_EPOCH = """
import sys
from testkit.toy import TOY, decomposable, toy_run_config
from nli_models.data import prepare_data
from nli_models.training import Trainer, make_trainer
entered = []
timed_epoch = Trainer.train_epoch
def train_epoch(self, epoch):
    entered.append("torch._dynamo" in sys.modules)
    return timed_epoch(self, epoch)
Trainer.train_epoch = train_epoch
trainer = make_trainer(toy_run_config(decomposable(), TOY, epochs=1), prepare_data(TOY, cache_dir=sys.argv[1]))
print("torch._dynamo" in sys.modules, entered)
trainer.fit()
print(entered)
"""


def test_fit_builds_the_optimizer_before_the_first_epochs_clock_starts(tmp_path):
    """Building the optimizer imports torch._dynamo (about 1 s): in a new trial process that
    happens before the first epoch starts, not inside its epoch_time_s (nor an estimate's pilot)."""
    done = run_probe(FIRST_EPOCH, str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr[-2000:]
    made, fitted = done.stdout.splitlines()
    assert made == "False []"  # the trainer made: nothing imported yet
    assert fitted == "[True]"  # imported before the epoch began
