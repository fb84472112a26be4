"""Training k configurations of one architecture as one stacked model: no Ray, no MLflow.

``StackedTrainer(configs, data)`` takes one ``RunConfig`` per member. They may differ in the
name and in ``training.lr``, ``training.l2``, ``training.adagrad_accumulator``,
``training.seed`` (the member's initialisation) and the model's ``dropout`` (each member draws
its masks at its own rate: ``StackDropout``), and in nothing else (``check_stackable``). Each
member is built as a solo run builds it (``seed_everything(seed)``, ``build_for_data``), so with
dropout off member i's losses are those of the solo model and optimizer of ``configs[i]`` on the
same batches (tests/test_stacked.py). Each member trains on its solo run's batches: members of
one seed share one batch order; with several seeds, each step stacks every member's own batch
(``MemberBatch``: padded to one shape, a shorter batch's extra rows in no loss), and the model
runs its off-CPU path (``StackedModel.forward``).

Per member, as ``Trainer`` does per run: the epoch's train loss and accuracy, dev loss and
accuracy, best-on-dev tracking (``TrainState``, and the best weights as the solo model's
state_dict), patience. ``fit(callback)`` calls ``callback(trainer, results)`` after each epoch
with one ``EpochResult`` per member, None for a member that no longer trains (or diverged in
that epoch: ``stop_reasons`` says "diverged"). A member stops alone (the ``active`` mask):
``stop(i)`` (a scheduler's decision), patience, or a non-finite training loss ("diverged"); a
stopped member's parameters and optimizer state stay as they were and the others train on. Its
slice still runs forward and backward (the stack's shapes stay); a caller that stops many
members can rebuild a smaller stack from ``model.member_state_dict``.

``state_dict`` / ``load_state_dict``: a stack resumes exactly (each member's weights, optimizer
state, stop and best-on-dev state, and the RNG). Not stacked yet: layerwise training, gradient
clipping, bf16, CUDA graphs (refused where a config asks for them).
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nli_models.config import RunConfig, TrainingConfig
from nli_models.data import PreparedData, batch_indices, iterate_batches
from nli_models.data.batch import Batch
from nli_models.embeddings import PAD_INDEX
from nli_models.registry import count_parameters
from nli_models.stacked.model import STACKED_MODELS, StackedModel
from nli_models.stacked.stacked_optimizers import make_stacked_optimizer
from nli_models.training.metrics import Evaluation, class_accuracy
from nli_models.training.trainer import (
    EpochResult,
    Trainer,
    TrainState,
    build_for_data,
    make_trainer,
    resolve_device,
    seed_everything,
    use_tf32_matmuls,
)


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Python's, numpy's and torch's generators as they were before the block."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        yield
    random.setstate(python)
    np.random.set_state(numpy)


# What members may differ in: training fields, and the model's dropout rate (a model argument).
MEMBER_FIELDS = ("lr", "l2", "adagrad_accumulator", "seed", "dropout")

MemberCallback = Callable[["StackedTrainer", list[EpochResult | None]], None]


def check_stackable(configs: Sequence[RunConfig]) -> None:
    """ValueError unless the configs differ only in name and ``MEMBER_FIELDS`` and ask for
    nothing a stack does not do yet.

    Args:
        configs: the members' run configs.
    """
    if not configs:
        raise ValueError("a stack needs at least one configuration")

    def shape(config: RunConfig) -> dict:
        dumped = config.model_dump(exclude={"name"})
        for key in MEMBER_FIELDS:
            dumped["training"].pop(key, None)
            dumped["model"]["args"].pop(key, None)
        return dumped

    first = shape(configs[0])
    for config in configs[1:]:
        if shape(config) != first:
            raise ValueError(f"{config.name} differs from {configs[0].name} in more than "
                             f"{', '.join(MEMBER_FIELDS)}: it cannot join the stack")
    why = stack_refusal(configs[0].model.name, configs[0].training)
    if why is not None:
        raise ValueError(why)


def stack_refusal(model: str, training: TrainingConfig) -> str | None:
    """Why configurations of this model and training cannot be stacked (None: they can).

    Args:
        model: the registered model name.
        training: the training config the members share.
    """
    if model not in STACKED_MODELS:
        return f"model {model!r} is not stacked: stacked models are {', '.join(STACKED_MODELS)}"
    refused = {"training.layerwise": training.layerwise, "training.grad_clip": training.grad_clip is not None,
               "training.precision bf16": training.precision != "fp32",
               "training.cuda_graphs on": training.cuda_graphs == "on"}
    if any(refused.values()):
        return f"not stacked yet: {', '.join(k for k, v in refused.items() if v)}"
    return None


@dataclass
class MemberBatch:
    """A batch per member, padded to one shape ([k, B, L] inputs, [k, B] labels): members whose
    seeds differ train on their own solo runs' batches. ``rows`` is True at a member's own
    pairs; a shorter batch's missing rows repeat its first pair and count in no loss."""

    premise: torch.Tensor
    premise_mask: torch.Tensor
    hypothesis: torch.Tensor
    hypothesis_mask: torch.Tensor
    label: torch.Tensor
    rows: torch.Tensor

    @classmethod
    def of(cls, batches: Sequence[Batch], order_of_member: torch.Tensor) -> MemberBatch:
        """Args:
            batches: one batch per batch order (on the host).
            order_of_member: each member's index into ``batches`` (a CPU tensor).
        """
        size = max(len(batch) for batch in batches)
        premise_length = max(batch.premise.shape[1] for batch in batches)
        hypothesis_length = max(batch.hypothesis.shape[1] for batch in batches)
        positions = torch.arange(size)

        def padded(batch: Batch) -> tuple[torch.Tensor, ...]:
            rows = positions < len(batch)
            index = torch.where(rows, positions, 0)

            def pad(tensor: torch.Tensor, length: int, value: int | bool) -> torch.Tensor:
                return F.pad(tensor[index], (0, length - tensor.shape[1]), value=value)

            return (pad(batch.premise, premise_length, PAD_INDEX), pad(batch.premise_mask, premise_length, False),
                    pad(batch.hypothesis, hypothesis_length, PAD_INDEX),
                    pad(batch.hypothesis_mask, hypothesis_length, False), batch.label[index], rows)

        columns = zip(*(padded(batch) for batch in batches), strict=True)
        return cls(*(torch.stack(column)[order_of_member] for column in columns))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MemberBatch:
        """The batch on ``device`` (as ``Batch.to``)."""
        return MemberBatch(*(getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)))

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stacked model's positional arguments, [k, B, L] each."""
        return self.premise, self.premise_mask, self.hypothesis, self.hypothesis_mask


def _member_labels(batch: Batch | MemberBatch, size: int) -> torch.Tensor:
    """Each member's labels, [k, B]."""
    return batch.label if isinstance(batch, MemberBatch) else batch.label.expand(size, -1)


def _member_rows(batch: Batch | MemberBatch, size: int) -> torch.Tensor:
    """Where each member has a pair of its own, [k, B]."""
    return batch.rows if isinstance(batch, MemberBatch) else torch.ones_like(batch.label, dtype=torch.bool).expand(size, -1)


def _member_losses(logits: torch.Tensor, batch: Batch | MemberBatch) -> torch.Tensor:
    """Each member's mean cross-entropy over its own pairs, [k] (a solo run's loss)."""
    size = logits.shape[0]
    per_pair = F.cross_entropy(logits.flatten(0, 1).float(), _member_labels(batch, size).flatten(),
                               reduction="none").view(size, -1)
    if not isinstance(batch, MemberBatch):
        return per_pair.mean(dim=1)
    return torch.where(batch.rows, per_pair, 0.0).sum(dim=1) / batch.rows.sum(dim=1)


class StackedTrainer:
    def __init__(self, configs: Sequence[RunConfig], data: PreparedData):
        """Args:
            configs: one run config per member (``check_stackable``).
            data: the prepared data every member trains on.
        """
        check_stackable(configs)
        self.configs = list(configs)
        self.config = configs[0].training  # the shared fields (MEMBER_FIELDS are per member)
        self.data = data
        self.device = resolve_device(self.config.device)
        use_tf32_matmuls(self.device)
        if self.device.type == "cpu":
            torch.set_flush_denormal(True)  # as Trainer: denormals are ~100x slower on x86
        members = []
        for config in self.configs:
            seed_everything(config.training.seed)
            members.append(build_for_data(config, data))
        self.theta_m, self.theta_wm = count_parameters(members[0])  # per member, as a solo run counts
        self.model = StackedModel(members).to(self.device)
        self.optimizer = make_stacked_optimizer(self.model, [c.training for c in self.configs])
        self.size = len(self.configs)
        # Each member trains on its solo run's batches: one order per distinct seed.
        seeds = [config.training.seed for config in self.configs]
        self.batch_seeds = list(dict.fromkeys(seeds))
        self.order_of_member = torch.tensor([self.batch_seeds.index(seed) for seed in seeds])
        self.active = torch.ones(self.size, dtype=torch.bool, device=self.device)
        self.stop_reasons: list[str | None] = [None] * self.size
        self.states = [TrainState() for _ in self.configs]
        self.best_model_states: list[dict[str, torch.Tensor] | None] = [None] * self.size
        self.steps = 0  # optimizer steps of the stack
        self.epoch = 0  # epochs of the stack (a stopped member's own count stays where it stopped)
        # Where each member's loss stopped being finite: the step (0: it has not) and the loss.
        self.diverged_step = torch.zeros(self.size, dtype=torch.long, device=self.device)
        self.diverged_loss = torch.zeros(self.size, device=self.device)
        self._solo: dict[int, Trainer] = {}  # save_member_checkpoint's solo trainers

    def state_dict(self) -> dict:
        """Everything a resumed stack needs to continue exactly (tensors and plain values, so it
        loads with ``torch.load(weights_only=True)``): weights, optimizer state, which members
        still train and why the others stopped, each member's TrainState and best weights, the
        step and epoch counts, and torch's RNGs, the CPU's and each GPU's (dropout's masks)."""
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "active": self.active.cpu(), "stop_reasons": list(self.stop_reasons),
            "states": [asdict(state) for state in self.states],
            "best_models": list(self.best_model_states), "steps": self.steps, "epoch": self.epoch,
            "diverged_step": self.diverged_step.cpu(), "diverged_loss": self.diverged_loss.cpu(),
            "rng": torch.get_rng_state(),
            # Dropout draws on the device's generator: on a GPU its masks come from CUDA's.
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s output (of a stack of the same configurations).

        Args:
            state: what ``state_dict`` returned.
        """
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.active = state["active"].to(self.device)
        self.stop_reasons = list(state["stop_reasons"])
        self.states = [TrainState(**{**saved, "history": [EpochResult(**row) for row in saved["history"]]})
                       for saved in state["states"]]
        self.best_model_states = list(state["best_models"])
        self.steps, self.epoch = state["steps"], state["epoch"]
        self.diverged_step = state["diverged_step"].to(self.device)
        self.diverged_loss = state["diverged_loss"].to(self.device)
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def stop(self, member: int, reason: str = "stopped") -> None:
        """Stop one member: from now on its parameters and optimizer state do not change.

        Args:
            member: the member's index.
            reason: why (kept in ``stop_reasons``).
        """
        self.active[member] = False
        if self.stop_reasons[member] is None:
            self.stop_reasons[member] = reason

    def training_step(self, batch: Batch | MemberBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step of every active member on a batch on the trainer's device:
        (losses [k], logits [k, B, C]), detached, not read on the host. A member whose loss is
        not finite is dropped from ``active`` before the step.

        Args:
            batch: one batch for every member, or a batch per member (``MemberBatch``).
        """
        logits = self.model(*batch.inputs())
        losses = _member_losses(logits, batch)
        finite = torch.isfinite(losses.detach())
        diverging = self.active & ~finite
        self.diverged_step = torch.where(diverging, self.steps + 1, self.diverged_step)
        self.diverged_loss = torch.where(diverging, losses.detach(), self.diverged_loss)
        self.active &= finite
        self.optimizer.zero_grad(set_to_none=True)
        # Members add up: member i's gradient is its own loss's (no op mixes members); a stopped
        # member's loss (NaN included) is selected away, not multiplied by 0.
        torch.where(self.active, losses, 0.0).sum().backward()
        self.optimizer.step(self.active)
        return losses.detach(), logits.detach()

    def _batches(self, split: str, shuffle: bool, epoch: int = 0, seed: int | None = None) -> Iterator[Batch]:
        """A split's batches on the host, in the order a solo run of ``seed`` draws them."""
        bucketed = self.config.batching == "bucketed"
        rows = batch_indices(self.data.splits[split], self.config.batch_size, shuffle=shuffle,
                             seed=self.config.seed if seed is None else seed, epoch=epoch,
                             pool_batches=self.config.bucket_pool_batches if bucketed else None)
        return iterate_batches(self.data.splits[split], rows)

    def _training_batches(self, epoch: int) -> Iterator[Batch | MemberBatch]:
        """An epoch's training batches on the device: each member's solo run's. Members of one
        seed share their batches; members of several seeds get a ``MemberBatch`` per step."""
        if len(self.batch_seeds) == 1:
            for batch in self._batches("train", shuffle=True, epoch=epoch):
                yield batch.to(self.device, non_blocking=True)
            return
        orders = [self._batches("train", shuffle=True, epoch=epoch, seed=seed) for seed in self.batch_seeds]
        for batches in zip(*orders, strict=True):
            yield MemberBatch.of(batches, self.order_of_member).to(self.device, non_blocking=True)

    def train_epoch(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch (or up to max_steps): per member, the mean training loss and accuracy over
        the batches it trained on ([k] each; NaN for a member that trained on none)."""
        self.model.train()
        total_loss = torch.zeros(self.size, device=self.device)
        correct = torch.zeros(self.size, device=self.device)
        seen = torch.zeros(self.size, device=self.device)
        for batch in self._training_batches(epoch):
            if self.steps_exhausted():
                break
            trained = self.active.clone()
            losses, logits = self.training_step(batch)
            trained &= self.active  # a member that diverged at this step did not train on it
            self.steps += 1
            rows, labels = _member_rows(batch, self.size), _member_labels(batch, self.size)
            total_loss += torch.where(trained, losses, 0.0) * rows.sum(dim=1)
            correct += torch.where(trained, ((logits.argmax(dim=2) == labels) & rows).sum(dim=1), 0)
            seen += trained * rows.sum(dim=1)
        return total_loss / seen, correct / seen

    @torch.no_grad()
    def evaluate(self, split: str) -> list[Evaluation]:
        """Every member's evaluation on a split (one forward pass per batch for all)."""
        was_training = self.model.training
        self.model.eval()
        total_loss = torch.zeros(self.size, dtype=torch.float64, device=self.device)
        predictions, gold = [], []
        for batch in self._batches(split, shuffle=False):
            batch = batch.to(self.device, non_blocking=True)
            logits = self.model(*batch.inputs()).float()
            total_loss += F.cross_entropy(logits.flatten(0, 1), batch.label.repeat(self.size),
                                          reduction="none").view(self.size, -1).sum(dim=1)
            predictions.append(logits.argmax(dim=2))
            gold.append(batch.label)
        self.model.train(was_training)
        predicted = torch.cat(predictions, dim=1).cpu().numpy()
        gold_ids = torch.cat(gold).cpu().numpy()
        count = max(len(gold_ids), 1)
        losses = (total_loss / count).tolist()
        return [Evaluation(loss=losses[i], accuracy=float((predicted[i] == gold_ids).sum() / count),
                           class_accuracy=class_accuracy(gold_ids, predicted[i], self.data.labels),
                           predictions=predicted[i], gold=gold_ids)
                for i in range(self.size)]

    def steps_exhausted(self) -> bool:
        return self.config.max_steps is not None and self.steps >= self.config.max_steps

    def budget_spent(self) -> bool:
        """The shared budget (epochs, max_steps) is spent: every member still training ends."""
        return self.epoch >= self.config.epochs or self.steps_exhausted()

    def divergence(self, member: int) -> tuple[int, int, float] | None:
        """(epoch, step, loss) where the member's training loss stopped being finite (None: it
        did not). The epoch is the member's last: it trained no further.

        Args:
            member: the member's index.
        """
        step = int(self.diverged_step[member])
        if not step:
            return None
        return self.states[member].epoch + 1, step, float(self.diverged_loss[member])

    def save_member_checkpoint(self, member: int, directory: str | Path) -> None:
        """One member as its solo run's checkpoint (``Trainer.save_checkpoint``'s files): its
        weights, best-on-dev weights and TrainState, which a solo ``Trainer`` of its configuration
        loads to evaluate (a sweep's test evaluation) or to inspect. Not to train on: its
        optimizer state is a fresh solo optimizer's (the member's own lives in ``state_dict``).

        Args:
            member: the member's index.
            directory: the folder to write (Trainer.save_checkpoint's).
        """
        if member not in self._solo:
            with _rng_kept():  # building seeds every generator; the stack's draws go on as they were
                self._solo[member] = make_trainer(self.configs[member], self.data)
        solo = self._solo[member]
        solo.model.load_state_dict(self.model.member_state_dict(member))
        solo.state = copy.deepcopy(self.states[member])
        solo.best_model_state = self.best_model_states[member]
        with _rng_kept():
            solo.save_checkpoint(directory)

    def finished(self) -> bool:
        """Every member stopped, or the shared budget (epochs, max_steps) is spent."""
        return self.budget_spent() or not bool(self.active.any())

    def fit(self, callback: MemberCallback | None = None) -> list[TrainState]:
        """Train every member to the end of the budget, or until it stops; each member's state.

        Args:
            callback: called after each epoch with the trainer and one EpochResult per member
                (None for a member that did not train in that epoch; ``epoch_time_s`` is the
                stack's, all members together).
        """
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        if self.epoch == 0:  # as Trainer.fit; dropout's masks draw from it (the batches do not)
            seed_everything(self.config.seed)
        while not self.finished():
            self.epoch = epoch = self.epoch + 1
            started = time.perf_counter()
            training = self.active.tolist()
            train_loss, train_accuracy = (t.tolist() for t in self.train_epoch(epoch))
            diverged = [was and not now for was, now in zip(training, self.active.tolist(), strict=True)]
            dev = self.evaluate("dev")
            seconds = time.perf_counter() - started
            results: list[EpochResult | None] = []
            for member in range(self.size):
                if diverged[member]:
                    self.stop(member, "diverged")
                trained = training[member] and not diverged[member]
                results.append(self._member_epoch(member, epoch, train_loss[member], train_accuracy[member],
                                                  dev[member], seconds) if trained else None)
            if callback is not None:
                callback(self, results)
        return self.states

    def _member_epoch(self, member: int, epoch: int, train_loss: float, train_accuracy: float,
                      dev: Evaluation, seconds: float) -> EpochResult:
        """Record one member's epoch as Trainer does (best on dev, patience)."""
        state = self.states[member]
        is_best = dev.accuracy > state.best_dev_accuracy
        if is_best:
            state.best_dev_accuracy, state.best_train_accuracy = dev.accuracy, train_accuracy
            state.best_epoch, state.epochs_without_improvement = epoch, 0
            self.best_model_states[member] = self.model.member_state_dict(member)
        else:
            state.epochs_without_improvement += 1
        patience = self.config.patience
        if patience is not None and state.epochs_without_improvement >= patience:
            self.stop(member, "patience")
        result = EpochResult(epoch=epoch, train_loss=train_loss, train_accuracy=train_accuracy,
                             dev_loss=dev.loss, dev_accuracy=dev.accuracy, epoch_time_s=seconds,
                             is_best=is_best)
        state.epoch, state.steps = epoch, self.steps
        state.history.append(result)
        return result
