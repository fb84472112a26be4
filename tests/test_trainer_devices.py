"""What a GPU run relies on, checked on CPU (issue 24): a checkpoint written on one device type
loads on another; bf16 autocasts every layer but the recurrent ones, which stay float32; fp16 is
refused with a reason; same seed, same bits with 2 threads (by default and with
training.deterministic, which also sets the CUDA determinism flags)."""

from __future__ import annotations

import os

import pytest
import torch
from testkit.toy import toy_run_config
from torch.nn.utils.rnn import PackedSequence
from torch.utils._python_dispatch import TorchDispatchMode

from nli_models.config import ConfigError, RunConfig, validate_config
from nli_models.training import make_trainer

# The four papers' models, each the variant the GPU check trains.
MODELS = {
    "rocktaschel": {"name": "rocktaschel", "variant": "word_by_word",
                    "args": {"embedding_dim": 12, "hidden_size": 12, "dropout": 0.3}},
    "decomposable": {"name": "decomposable", "variant": "intra",
                     "args": {"embedding_dim": 12, "projection_dim": 12, "hidden_size": 12, "dropout": 0.2}},
    "abcnn": {"name": "abcnn", "variant": "abcnn3", "args": {"embedding_dim": 12, "hidden_size": 12}},
    "cam": {"name": "cam", "variant": "full", "args": {"embedding_dim": 12, "hidden_size": 12, "dropout": 0.4}},
}
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


# -- checkpoints ---------------------------------------------------------------------------------


class FakeCuda:
    """torch.cuda as a 1-GPU machine shows it to the checkpoint code: an RNG state to save, and a
    set_rng_state_all that, like the real one, accepts only CPU ByteTensors (recorded)."""

    def __init__(self, monkeypatch):
        self.state = torch.arange(16, dtype=torch.uint8)
        self.restored = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.state.clone()])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self.set_rng_state_all)

    def set_rng_state_all(self, states):
        for state in states:
            if state.device.type != "cpu" or state.dtype != torch.uint8:
                raise TypeError(f"RNG state must be a torch.ByteTensor, got {state.dtype} on {state.device}")
        self.restored.append([s.clone() for s in states])


def test_a_checkpoint_loads_into_a_trainer_on_another_device(toy, tmp_path, monkeypatch):
    """Saved by a CPU trainer with a CUDA RNG state; loaded by a trainer whose device is another
    (meta: tensors without values, so an RNG state or weight read there is unusable; the model
    itself stays on the CPU, as the embedding table's load needs its values): the RNG states are
    restored from CPU ByteTensors, the weights, optimizer state and best-on-dev weights equal
    the saved ones."""
    config = toy_run_config(MODELS["decomposable"], epochs=1, device="cpu")
    saved = make_trainer(config, toy)
    saved.fit()
    # Only the checkpoint sees the fake GPU: with a CUDA build of torch, an optimizer step that
    # believes CUDA is there asks the real driver whether a graph is being captured.
    cuda = FakeCuda(monkeypatch)
    saved.save_checkpoint(tmp_path)
    expected_draw = torch.rand(4)  # what the restored CPU RNG must give next

    loading = make_trainer(config, toy)
    loading.device = torch.device("meta")
    loading.load_checkpoint(tmp_path)

    assert len(cuda.restored) == 1 and torch.equal(cuda.restored[0][0], cuda.state)
    assert torch.equal(torch.rand(4), expected_draw)
    for name, value in saved.model.state_dict().items():
        assert torch.equal(loading.model.state_dict()[name], value), name
    loaded_moments, saved_moments = (t.optimizer.state_dict()["state"] for t in (loading, saved))
    assert loaded_moments.keys() == saved_moments.keys() and loaded_moments
    for index, moments in saved_moments.items():
        for key, value in moments.items():
            assert torch.equal(loaded_moments[index][key], value), (index, key)
    assert loading.best_model_state.keys() == saved.best_model_state.keys()
    for key, value in saved.best_model_state.items():
        assert loading.best_model_state[key].device.type == "cpu"
        assert torch.equal(loading.best_model_state[key], value), key
    assert loading.state.epoch == 1 and loading.state.steps == saved.state.steps


# -- precision -----------------------------------------------------------------------------------


class KernelDtypes(TorchDispatchMode):
    """The floating dtypes each recurrent kernel (forward and backward) runs on, after autocast."""

    RECURRENT = ("rnn", "lstm")

    def __init__(self):
        super().__init__()
        self.recurrent: list[tuple[str, set]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if any(word in name for word in self.RECURRENT):
            floats = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
            self.recurrent.append((name, floats))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("model", list(MODELS))
def test_bf16_autocasts_every_layer_but_the_recurrent_ones(toy, model):
    trainer = make_trainer(
        toy_run_config(MODELS[model], precision="bf16", device="cpu", max_steps=1, epochs=1), toy
    )
    assert trainer.autocast_dtype == torch.bfloat16
    seen = {}  # module name -> (input dtypes, output dtype)

    def tensor_of(value):  # a PackedSequence holds its tensor in .data
        return value.data if isinstance(value, PackedSequence) else value

    def record(name):
        def hook(module, inputs, output):
            out = tensor_of(output[0] if isinstance(output, tuple) else output)
            seen[name] = ({tensor_of(x).dtype for x in inputs if torch.is_tensor(tensor_of(x))}, out.dtype)
        return hook

    for name, module in trainer.model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.LSTM)):
            module.register_forward_hook(record(name))
    with KernelDtypes() as kernels:
        loss, _ = trainer.train_epoch(1)
    assert trainer.state.steps == 1 and loss == loss  # one step, a finite loss

    layers = {n for n, m in trainer.model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d))}
    called = layers & seen.keys()
    for name in called:
        assert seen[name][1] == torch.bfloat16, f"{name} computed in {seen[name][1]}"
    # Layers whose weights are used without calling them: word-by-word attention's (W^y, W^h and
    # the recurrence's, float32, below), ops that fuse a layer with an add (autocast, bf16:
    # Rocktäschel's W^p in h*'s addmm, additive attention's w in the scores' addmm) and ABCNN's
    # output layer (F.linear over the active blocks' columns).
    uncalled = {"rocktaschel": {"attention.w", "attention.w_y", "attention.w_h", "w_r", "w_t", "w_p"},
                "cam": {"intra_attention.w"}, "abcnn": {"output"}}
    assert layers - called == uncalled.get(model, set())
    # The LSTMs: held runs call the fused kernel directly (seen by the dispatch recorder), the
    # others call the module (seen by its hook; on CPU a packed run is a loop of matmuls).
    lstm_calls = {n: v for n, v in seen.items() if isinstance(trainer.model.get_submodule(n), torch.nn.LSTM)}
    has_lstm = any(isinstance(m, torch.nn.LSTM) for m in trainer.model.modules())
    assert bool(kernels.recurrent or lstm_calls) == has_lstm
    for kernel, dtypes in kernels.recurrent:
        assert dtypes == {torch.float32}, f"{kernel} ran on {dtypes}"
    for name, (inputs, out) in lstm_calls.items():
        assert inputs == {torch.float32} and out == torch.float32, name
    if model == "rocktaschel":  # h_N, a float32 recurrent result, reaches W^x as float32
        assert seen["w_x"][0] == {torch.float32}


def test_fp16_is_refused_with_the_reason_and_what_to_use():
    raw = {"name": "x", "model": MODELS["cam"], "data": {"corpus": "toy"}, "training": {"precision": "fp16"}}
    with pytest.raises(ConfigError, match=r"run.yaml: training.precision: 'fp16' is not offered .*use 'bf16'"):
        validate_config(RunConfig, raw, "run.yaml")


# -- determinism ---------------------------------------------------------------------------------


@pytest.fixture
def two_threads(monkeypatch):
    """Torch on 2 threads and the determinism flags as they were, afterwards."""
    threads = torch.get_num_threads()
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


# The sizes at which 2 threads changed the result run to run before the row gather was made
# deterministic (rocktaschel, decomposable: 8 of 8 runs differed after 3 steps).
LARGE = {
    "rocktaschel": {**MODELS["rocktaschel"], "args": {"embedding_dim": 300, "hidden_size": 100, "dropout": 0.3}},
    "decomposable": {**MODELS["decomposable"],
                     "args": {"embedding_dim": 300, "projection_dim": 200, "hidden_size": 200, "dropout": 0.2}},
}


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("model", list(LARGE))
def test_same_seed_same_parameters_with_two_threads(toy, model, deterministic, two_threads):
    def run():
        config = toy_run_config(LARGE[model], max_steps=3, epochs=1, batch_size=32,
                                num_threads=2, deterministic=deterministic)
        trainer = make_trainer(config, toy)
        trainer.fit()
        assert torch.get_num_threads() == 2 and trainer.state.steps == 3
        return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    first, second = run(), run()
    for key, value in first.items():
        assert torch.equal(value, second[key]), f"{key} differs between two runs of one seed"
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert torch.backends.cudnn.deterministic == deterministic
    if deterministic:
        assert not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_fp32_matmuls_use_tf32_on_cuda_only():
    from nli_models.training.trainer import use_tf32_matmuls

    before = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        use_tf32_matmuls(torch.device("cpu"))
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        use_tf32_matmuls(torch.device("cuda", 0))
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
