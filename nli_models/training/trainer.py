"""A plain PyTorch training loop for every registered model: no Ray, no MLflow.

The sweep attaches to it through the per-epoch callback; everything needed to resume exactly
(model, optimizer, epoch, RNG state, best-so-far) goes into one checkpoint file.

Budget: ``training.epochs`` and, optionally, ``training.max_steps`` (optimizer steps, one per
batch, counted over the whole run), whichever is reached first. The dev set is evaluated, the
best-on-dev weights kept and the callback (checkpoint) run after every epoch, and after the
partial epoch in which max_steps is reached, which counts as an epoch of its own in the history.

Layerwise training (``training.layerwise``, Yin et al. §5.1.2) runs one phase per block of a
model with ``train_blocks_up_to``: phase k trains block k with blocks 1..k-1 frozen. Each phase has
the epoch budget and patience of a whole run and its own best-on-dev tracking; the next phase
starts from the previous phase's best-on-dev weights. Epoch numbers run on across phases.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nli_models.config import RunConfig, TrainingConfig
from nli_models.data import PreparedData, batch_indices, iterate_batches
from nli_models.data.batch import Batch
from nli_models.errors import InputError, InputFileMissing
from nli_models.registry import build_model, count_parameters, model_class
from nli_models.training.cuda_graphs import GraphCaptureFailed, GraphedTrainingStep
from nli_models.training.metrics import Evaluation, evaluate
from nli_models.training.optimizers import make_optimizer

CHECKPOINT_FILE = "checkpoint.pt"
TRIAL_CONFIG_FILE = "config.yaml"  # the RunConfig saved beside a sweep trial's checkpoint


@dataclass
class EpochResult:
    epoch: int
    train_loss: float
    train_accuracy: float
    dev_loss: float
    dev_accuracy: float
    epoch_time_s: float
    is_best: bool


@dataclass
class TrainState:
    """Progress that survives a checkpoint; epoch counts completed epochs."""

    epoch: int = 0
    best_dev_accuracy: float = -1.0
    best_train_accuracy: float = 0.0
    best_epoch: int = 0
    epochs_without_improvement: int = 0
    history: list[EpochResult] = field(default_factory=list)
    steps: int = 0  # optimizer steps taken (checkpoints older than this field load as 0)
    phase: int = 1  # layerwise training: the block being trained
    phase_start_epoch: int = 0


EpochCallback = Callable[["Trainer", EpochResult], None]


class CheckpointRefused(InputError):
    """A checkpoint file holds something other than tensors and plain values, or is corrupt."""


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite: the trial stops and is never selected."""

    def __init__(self, epoch: int, step: int, loss: float):
        super().__init__(f"training loss became {loss} at epoch {epoch}, step {step}")
        self.epoch, self.step, self.loss = epoch, step, loss


class DeviceUnavailable(ValueError):
    """training.device names a device this machine lacks: a config error (CLI exit code 2)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"training.device={name!r} but CUDA is not available on this machine "
                "(use 'cpu' or 'auto')"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceUnavailable(
                f"training.device={name!r} but this machine has {count} CUDA device(s) "
                f"(cuda:0 to cuda:{count - 1})"
            )
    return device


def use_deterministic_algorithms(enabled: bool) -> None:
    """training.deterministic: only deterministic kernels in this process (process-wide flags).

    Without it a run is bit-identical for a seed on CPU (at any thread count) but not on CUDA,
    where cuDNN picks algorithms by timing (benchmark) and some kernels add with atomics in
    whatever order threads finish. cuBLAS needs a fixed workspace for reproducible results
    (CUBLAS_WORKSPACE_CONFIG, read when the process first uses cuBLAS): it is set here, before
    the trainer's model reaches the device; a value the environment already has is kept."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = enabled
    # torch.use_deterministic_algorithms imports torch._inductor (about 1 s of CPU; a process that
    # evaluates saved weights needs nothing else of it): called only to change the flag.
    if enabled != torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(enabled)


def use_tf32_matmuls(device: torch.device) -> None:
    """On CUDA, fp32 matmuls run on TF32 tensor cores (Ampere and newer; 10-bit mantissa inputs,
    float32 accumulation), as cuDNN's convolutions and RNNs already do by default: several times
    the fp32 matmul rate. A process-wide setting; nothing changes on the CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_fits_data(config: RunConfig, data: PreparedData) -> None:
    """InputError when the model's embedding_dim contradicts the word vectors' dimension, or the
    corpus holds a sentence longer than the model takes (a sweep checks this before its first
    trial, so that no trial fails on it)."""
    configured = config.model.args.get("embedding_dim")
    if data.embedding_dim and configured is not None and configured != data.embedding_dim:
        raise InputError(
            f"model.args.embedding_dim={configured} but the word vectors "
            f"({config.data.vectors.source}) have dimension {data.embedding_dim}; "
            f"set model.args.embedding_dim: {data.embedding_dim} or leave it out"
        )
    model = model_class(config.model.name)
    args = model.Arguments.parse(_model_kwargs(config, data), config.model.name)
    try:
        model.check_longest_sentence(args, longest_sentence(data))
    except ValueError as exc:
        raise InputError(str(exc)) from None


def longest_sentence(data: PreparedData) -> int:
    """The most tokens of any premise or hypothesis of any split."""
    return max((int(lengths.max()) for split in data.splits.values()
                for lengths in (split.premise_lengths, split.hypothesis_lengths) if len(lengths)), default=0)


def _model_kwargs(config: RunConfig, data: PreparedData) -> dict:
    """The configured model's constructor arguments for prepared data (its vocabulary, labels and
    the vectors' dimension)."""
    embedding_dim = data.embedding_dim or config.model.args.get("embedding_dim", 300)
    return config.model.build_kwargs(len(data.vocab), len(data.labels), embedding_dim)


def build_for_data(config: RunConfig, data: PreparedData) -> nn.Module:
    """Build the configured model for prepared data; loads pretrained vectors when present."""
    check_fits_data(config, data)
    model = build_model(config.model.name, **_model_kwargs(config, data))
    if data.embedding_init is not None:
        weight, trainable_rows = data.embedding_init
        model.word_embeddings.load(weight, trainable_rows)
    return model


class Trainer:
    def __init__(self, model: nn.Module, data: PreparedData, config: TrainingConfig):
        self.config = config
        self.data = data
        self.device = resolve_device(config.device)
        use_deterministic_algorithms(config.deterministic)
        use_tf32_matmuls(self.device)
        if self.device.type == "cpu":
            # Saturated tanh and softmax gradients underflow into denormal floats, which x86 CPUs
            # compute ~100x slower: a word-by-word step went from 112 to 210 ms once the model
            # saturated. With this, values below 1.2e-38 become 0 (threads started later inherit it).
            torch.set_flush_denormal(True)
        self.model = model.to(self.device)
        self._optimizer: torch.optim.Optimizer | None = None
        # The training step as CUDA graphs (training.cuda_graphs), built with the optimizer.
        self._graphed: GraphedTrainingStep | None = None
        if config.cuda_graphs == "on" and self.device.type != "cuda":
            raise DeviceUnavailable(
                f"training.cuda_graphs='on' needs a CUDA device, but training runs on "
                f"{self.device.type} (use 'auto': graphs where CUDA is, eager elsewhere)"
            )
        # The optimizer holds the parameters trainable now, however late it is built (layerwise
        # training freezes blocks before the first step).
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        self._optimizer_state: dict | None = None  # a checkpoint's, until the optimizer is built
        self.state = TrainState()
        self.best_model_state: dict[str, torch.Tensor] | None = None
        # bf16 on every device (CPU autocast too); the models keep their recurrent layers in
        # float32 (nli_models.models.layers.recurrent_precision).
        self.autocast_dtype = torch.bfloat16 if config.precision == "bf16" else None
        self.theta_m, self.theta_wm = count_parameters(model)
        if config.layerwise and not hasattr(model, "train_blocks_up_to"):
            raise ValueError(
                f"training.layerwise needs a model built of blocks (abcnn); "
                f"{type(model).__name__} has none"
            )

    # -- training -------------------------------------------------------------------------
    def _batches(self, split: str, shuffle: bool, epoch: int = 0):
        pin = self.device.type == "cuda"
        bucketed = self.config.batching == "bucketed"
        examples = self.data.splits[split]
        rows = batch_indices(
            examples,
            self.config.batch_size,
            shuffle=shuffle,
            seed=self.config.seed,
            epoch=epoch,
            pool_batches=self.config.bucket_pool_batches if bucketed else None,
        )
        static = self._graphed is not None and split == "train"
        for batch in iterate_batches(examples, rows):
            if static:  # one captured graph per shape: a few shapes, not one per batch
                batch = batch.padded_to_static_lengths()
            yield batch.pin_memory() if pin else batch

    def train_epoch(self, epoch: int) -> tuple[float, float]:
        self.model.train()
        total_loss = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        seen = 0
        # On a CPU the check costs nothing and stops at the first bad step; on a GPU a check per
        # step would synchronise every batch, so it happens once per epoch (below).
        check_each_step = self.device.type == "cpu"
        for step, batch in enumerate(self._batches("train", shuffle=True, epoch=epoch), start=1):
            if self.steps_exhausted():
                break
            batch = batch.to(self.device, non_blocking=True)
            loss, logits = self.training_step(batch, (epoch, step) if check_each_step else None)
            self.state.steps += 1
            # Accumulate on the device: a .item() per step would synchronise a GPU every batch.
            total_loss += loss.detach() * len(batch)
            correct += (logits.detach().argmax(dim=1) == batch.label).sum()
            seen += len(batch)
        seen = max(seen, 1)
        if not math.isfinite(float(total_loss)):
            raise TrainingDiverged(epoch, step, float(total_loss))
        return float(total_loss) / seen, float(correct) / seen

    def training_step(self, batch: Batch, check_at: tuple[int, int] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on a batch already on the trainer's device (a CUDA graph's replay
        where graphs are on): (loss, logits), neither read on the host.

        Args:
            batch: the batch (padded to static lengths where graphs are on: ``_batches``).
            check_at: (epoch, step): a non-finite loss raises TrainingDiverged before the step
                (a host read: the CPU's check; a GPU checks once per epoch).
        """
        if self._graphed is not None:
            return self._graphed(batch)
        loss, logits = self._loss(batch)
        if check_at is not None and not math.isfinite(float(loss.detach())):
            raise TrainingDiverged(*check_at, float(loss.detach()))
        self.optimizer.zero_grad(set_to_none=True)
        self._apply_gradients(loss)
        return loss, logits

    def _loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, logits) of a training batch. Autocast's cache of cast weights cannot outlive a
        CUDA graph's capture, so it is off while graphs are."""
        with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                            enabled=self.autocast_dtype is not None,
                            cache_enabled=self._graphed is None):
            logits = self.model(*batch.inputs())
        return nn.functional.cross_entropy(logits.float(), batch.label), logits

    def _apply_gradients(self, loss: torch.Tensor) -> None:
        loss.backward()
        if self.config.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()

    def _graphed_training_step(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The step a CUDA graph captures: forward, loss, backward, clipping, optimizer step."""
        loss, logits = self._loss(batch)
        self._apply_gradients(loss)
        return loss, logits

    def evaluate(self, split: str) -> Evaluation:
        return evaluate(
            self.model,
            self._batches(split, shuffle=False),
            self.data.labels,
            self.device,
            self.autocast_dtype,
        )

    def fit(self, callback: EpochCallback | None = None) -> TrainState:
        """Train from the current state to the end of the budget (epochs, max_steps, patience;
        with layerwise, of every phase)."""
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        if self.state.epoch == 0:
            seed_everything(self.config.seed)
        self._built_optimizer()  # not on the first epoch's clock (epoch_time_s)
        while True:
            self._fit_phase(callback)
            if not self._next_phase():
                return self.state

    def _fit_phase(self, callback: EpochCallback | None) -> None:
        if self.config.layerwise:
            self.model.train_blocks_up_to(self.state.phase)
        while not self.phase_done():
            epoch = self.state.epoch + 1
            started = time.perf_counter()
            train_loss, train_accuracy = self.train_epoch(epoch)
            dev = self.evaluate("dev")
            is_best = dev.accuracy > self.state.best_dev_accuracy
            if is_best:
                self.state.best_dev_accuracy = dev.accuracy
                self.state.best_train_accuracy = train_accuracy
                self.state.best_epoch = epoch
                self.state.epochs_without_improvement = 0
                self.best_model_state = copy.deepcopy(
                    {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
                )
            else:
                self.state.epochs_without_improvement += 1
            result = EpochResult(
                epoch=epoch,
                train_loss=train_loss,
                train_accuracy=train_accuracy,
                dev_loss=dev.loss,
                dev_accuracy=dev.accuracy,
                epoch_time_s=time.perf_counter() - started,
                is_best=is_best,
            )
            self.state.epoch = epoch
            self.state.history.append(result)
            if callback is not None:
                callback(self, result)

    def phase_done(self) -> bool:
        epochs = self.state.epoch - self.state.phase_start_epoch
        return epochs >= self.config.epochs or self.should_stop() or self.steps_exhausted()

    def _next_phase(self) -> bool:
        """Layerwise: move to the next block from this phase's best-on-dev weights."""
        if not self.config.layerwise or self.steps_exhausted():
            return False
        if self.state.phase >= self.model.num_blocks:
            return False
        if self.best_model_state is not None:
            self.model.load_state_dict(self.best_model_state)
        self.state.phase += 1
        self.state.phase_start_epoch = self.state.epoch
        if self._graphed is not None:  # other parameters train now: capture the step anew
            self._graphed = self._new_graphed_step()
        self.state.best_dev_accuracy = -1.0
        self.state.epochs_without_improvement = 0
        self.best_model_state = None
        return True

    def finished(self) -> bool:
        """Training ended by itself: budget, patience, and (layerwise) the last phase."""
        last_phase = not self.config.layerwise or self.state.phase >= self.model.num_blocks
        return self.steps_exhausted() or (last_phase and self.phase_done())

    def steps_exhausted(self) -> bool:
        limit = self.config.max_steps
        return limit is not None and self.state.steps >= limit

    def should_stop(self) -> bool:
        patience = self.config.patience
        return patience is not None and self.state.epochs_without_improvement >= patience

    def evaluate_best(self, split: str) -> Evaluation:
        """Evaluate the best-on-dev weights (test data is evaluated this way, once)."""
        current = self.model.state_dict()
        if self.best_model_state is None:
            return self.evaluate(split)
        saved = {k: v.detach().clone() for k, v in current.items()}
        self.model.load_state_dict(self.best_model_state)
        try:
            return self.evaluate(split)
        finally:
            self.model.load_state_dict(saved)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Built on first use (fit builds it before the first epoch's clock starts), with the state
        a loaded checkpoint brought: evaluating saved weights (a sweep's test evaluation) needs no
        optimizer, and building one imports torch._dynamo, about 1 s of CPU."""
        return self._built_optimizer()

    def _built_optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            graphs = self.config.cuda_graphs == "on" or (
                self.config.cuda_graphs == "auto" and self.device.type == "cuda")
            self._optimizer = self._make_optimizer(capturable=graphs)
            if self._optimizer_state is not None:
                if len(self._optimizer_state["param_groups"]) != len(self._optimizer.param_groups):
                    # Saved when the word vectors had a group of their own even without ℓ2.
                    self._optimizer = self._make_optimizer(capturable=graphs, split_embeddings=True)
                self._optimizer.load_state_dict(self._optimizer_state)
                self._optimizer_state = None
            graphs = graphs and self._optimizer_is_capturable()
            self._graphed = self._new_graphed_step() if graphs else None
        return self._optimizer

    def _make_optimizer(self, capturable: bool, split_embeddings: bool | None = None) -> torch.optim.Optimizer:
        try:
            return make_optimizer(self.model, self.config, self._trainable, capturable=capturable,
                                  split_embeddings=split_embeddings)
        except ValueError as exc:  # no capturable step for this optimizer here
            if self.config.cuda_graphs == "on":
                raise GraphCaptureFailed(f"training.cuda_graphs='on': {exc}") from None
            print(f"note: the training step runs eagerly: {exc}", file=sys.stderr)
            return make_optimizer(self.model, self.config, self._trainable, split_embeddings=split_embeddings)

    def _optimizer_is_capturable(self) -> bool:
        """Adam built capturable, or fused Adagrad (its step count lives on the device)."""
        return all(g.get("capturable") or g.get("fused") for g in self._optimizer.param_groups)

    def _new_graphed_step(self) -> GraphedTrainingStep:
        return GraphedTrainingStep(self._graphed_training_step, self.model, self._optimizer,
                                   required=self.config.cuda_graphs == "on")

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer, self._optimizer_state, self._graphed = optimizer, None, None

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # Tensors and plain Python values only, so that it loads with weights_only=True.
        numpy_rng = np.random.get_state(legacy=False)
        numpy_rng["state"]["key"] = numpy_rng["state"]["key"].tolist()
        payload = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "state": asdict(self.state),
            "best_model": self.best_model_state,
            "rng": {
                "python": random.getstate(),
                "numpy": numpy_rng,
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            },
        }
        path = directory / CHECKPOINT_FILE
        tmp = path.with_suffix(".tmp")
        torch.save(payload, tmp)
        tmp.replace(path)  # a reader never sees a half-written checkpoint
        return path

    def load_checkpoint(self, directory: str | Path) -> None:
        """Resume from a checkpoint written on any device. Everything is read to the CPU first:
        the RNG states must be CPU ByteTensors (torch.cuda.set_rng_state_all refuses others);
        the model's weights are copied into its parameters on this trainer's device and the
        optimizer's state moves to its parameters' device as it loads; best-on-dev weights stay
        on the CPU, where training keeps them."""
        payload = read_checkpoint(Path(directory) / CHECKPOINT_FILE, "cpu")
        self.model.load_state_dict(payload["model"])
        self._optimizer, self._optimizer_state, self._graphed = None, payload["optimizer"], None
        state = payload["state"]
        state["history"] = [EpochResult(**row) for row in state["history"]]
        self.state = TrainState(**state)
        self.best_model_state = payload["best_model"]
        rng = payload["rng"]
        random.setstate(rng["python"])
        numpy_rng = copy.deepcopy(rng["numpy"])
        numpy_rng["state"]["key"] = np.array(numpy_rng["state"]["key"], dtype=np.uint32)
        np.random.set_state(numpy_rng)
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            # One state per GPU of the saving machine; this one may have fewer.
            torch.cuda.set_rng_state_all(rng["cuda"][: torch.cuda.device_count()])


def read_checkpoint(path: str | Path, map_location: torch.device | str = "cpu") -> dict:
    """A checkpoint's tensors and plain values (on the CPU unless map_location says otherwise;
    Trainer.load_checkpoint needs them there). weights_only=True: unpickling may build only
    tensors and plain types, so a checkpoint that someone else logged to the tracking server
    cannot run code here; anything else is refused with InputError naming the file."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise InputFileMissing(f"{path}: no such checkpoint file") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointRefused(
            f"{path}: refused to load: not a checkpoint of plain tensors and values "
            f"({first_line}); only checkpoints written by this version of nli-orchestrator load"
        ) from None
    if not isinstance(payload, dict) or not {"model", "optimizer", "state", "rng"} <= set(payload):
        raise CheckpointRefused(f"{path}: not a training checkpoint (expected model, optimizer, "
                                "state and rng entries)")
    return payload


def make_trainer(config: RunConfig, data: PreparedData) -> Trainer:
    """Seed, build the model for the data, and wrap it in a Trainer."""
    seed_everything(config.training.seed)
    return Trainer(build_for_data(config, data), data, config.training)
