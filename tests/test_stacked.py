"""Stacked trials (issue 47): k configurations of one architecture trained as one model.

Each member must be its solo run: the per-member optimizers equal torch.optim member by member,
and with dropout off a member's losses over 20 steps equal the solo Trainer's step on the same
batches (fp32, CPU). Dropout draws each member's own masks; a stopped or diverged member stays
as it was and changes nothing for the others."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_host_sync import host_reads_raise  # noqa: F401 (a fixture)
from test_models_contract import _batch, _build
from testkit.batches import random_batch
from testkit.toy import TOY, toy_run_config

from nli_models import build_model
from nli_models.config import TrainingConfig
from nli_models.data import batch_indices, iterate_batches
from nli_models.models import layers
from nli_models.models.stepwise_lstm import StepwiseLSTM
from nli_models.stacked import (
    StackDropout,
    StackedAdagrad,
    StackedAdam,
    StackedModel,
    StackedTrainer,
    WindowedConv1d,
    check_stackable,
    make_stacked_optimizer,
    stacked_optimizers,
)
from nli_models.training.trainer import make_trainer

STEPS = 20
MODELS = {
    "decomposable": {"name": "decomposable", "variant": "vanilla",
                     "args": {"embedding_dim": 8, "projection_dim": 8, "hidden_size": 8, "dropout": 0.0}},
    "decomposable_intra": {"name": "decomposable", "variant": "intra",
                           "args": {"embedding_dim": 8, "projection_dim": 8, "hidden_size": 8, "dropout": 0.0}},
    "abcnn3": {"name": "abcnn", "variant": "abcnn3",
               "args": {"embedding_dim": 8, "hidden_size": 6, "nonover": True, "max_length": 40}},
    "word_by_word": {"name": "rocktaschel", "variant": "word_by_word",
                     "args": {"embedding_dim": 8, "hidden_size": 8, "two_way": True}},
    "conditional_shared": {"name": "rocktaschel", "variant": "conditional",
                           "args": {"embedding_dim": 8, "hidden_size": 8, "shared_encoder": True}},
    "cam": {"name": "cam", "variant": "full", "args": {"embedding_dim": 8, "hidden_size": 6}},
}
# (lr, l2, seed) per member: members differ in all three.
MEMBERS = ((0.01, 0.0, 1), (0.05, 1e-3, 1), (0.02, 1e-2, 7))


def _configs(model: str, optimizer: str, members=MEMBERS, dropout: float | None = None):
    spec = MODELS[model]
    if dropout is not None:
        spec = {**spec, "args": {**spec["args"], "dropout": dropout}}
    return [toy_run_config(spec, TOY, optimizer=optimizer, lr=lr, l2=l2, seed=seed, batch_size=8,
                           device="cpu")
            for lr, l2, seed in members]


def _batches(data, count: int = STEPS):
    rows = batch_indices(data.splits["train"], 8, shuffle=True, seed=3, epoch=1)
    return list(itertools.islice(iterate_batches(data.splits["train"], rows), count))


# -- per-member optimizers ----------------------------------------------------------------------

@pytest.mark.parametrize("host", [True, False], ids=["fused_on_host", "masked_off_host"])
@pytest.mark.parametrize("name", ["adam", "adagrad"])
def test_each_member_steps_as_torch_optim_does(name, host, monkeypatch):
    """Same lr, ℓ2 (and Adagrad accumulator) per member as a torch optimizer of that member:
    equal parameters after every one of 6 steps; on the CPU (torch's fused kernel per member)
    and by the masked update the other devices take (run here on CPU tensors)."""
    if not host:
        monkeypatch.setattr(stacked_optimizers.layers, "on_host", lambda tensor: False)
    lr, l2, accumulator = torch.tensor([0.1, 0.01, 0.3]), torch.tensor([0.0, 1e-2, 0.5]), torch.tensor([0.1, 0.0, 1.0])
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 4, 5, generator=generator), torch.randn(3, 5, generator=generator)]
    stacked = [p.clone().requires_grad_() for p in start]
    solo = [[p[i].clone().requires_grad_() for p in start] for i in range(3)]
    if name == "adam":
        optimizer = StackedAdam(stacked, lr=lr, weight_decay=l2)
        references = [torch.optim.Adam(solo[i], lr=float(lr[i]), weight_decay=float(l2[i])) for i in range(3)]
    else:
        optimizer = StackedAdagrad(stacked, lr=lr, weight_decay=l2, initial_accumulator_value=accumulator)
        references = [torch.optim.Adagrad(solo[i], lr=float(lr[i]), weight_decay=float(l2[i]),
                                          initial_accumulator_value=float(accumulator[i])) for i in range(3)]
    for _ in range(6):
        grads = [torch.randn(p.shape, generator=generator) for p in stacked]
        for p, g in zip(stacked, grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
        for i, reference in enumerate(references):
            for p, g in zip(solo[i], grads, strict=True):
                p.grad = g[i].clone()
            reference.step()
            for p, q in zip(stacked, solo[i], strict=True):
                torch.testing.assert_close(p[i], q, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("host", [True, False], ids=["fused_on_host", "masked_off_host"])
@pytest.mark.parametrize("optimizer_class", [StackedAdam, StackedAdagrad])
def test_an_inactive_member_keeps_its_parameters_and_state(optimizer_class, host, monkeypatch):
    if not host:
        monkeypatch.setattr(stacked_optimizers.layers, "on_host", lambda tensor: False)
    parameter = torch.ones(2, 3, requires_grad=True)
    hyper = {"lr": torch.tensor([0.1, 0.1]), "weight_decay": torch.zeros(2)}
    if optimizer_class is StackedAdagrad:
        hyper["initial_accumulator_value"] = torch.zeros(2)
    optimizer = optimizer_class([parameter], **hyper)
    parameter.grad = torch.ones(2, 3)
    optimizer.step()
    before = {k: v.clone() for k, v in optimizer.state[parameter].items()}
    frozen = parameter[1].detach().clone()
    parameter.grad = torch.full((2, 3), float("nan"))  # a diverged member's gradient
    parameter.grad[0] = 1.0
    optimizer.step(active=torch.tensor([True, False]))
    assert torch.equal(parameter[1], frozen)
    assert not torch.equal(parameter[0], frozen)
    for key, value in optimizer.state[parameter].items():
        assert torch.equal(value[1], before[key][1]), key
        assert torch.isfinite(value).all(), key
    assert optimizer.state[parameter]["member_step"].tolist() == [2.0, 1.0]


# -- the stacked model --------------------------------------------------------------------------

EVERY_STACKED_ARCHITECTURE = [
    ("decomposable", {"variant": "vanilla"}), ("decomposable", {"variant": "intra"}),
    ("abcnn", {"variant": "abcnn3", "nonover": True}), ("abcnn", {"variant": "abcnn1", "num_blocks": 2}),
    ("rocktaschel", {"variant": "conditional", "shared_encoder": True}),
    ("rocktaschel", {"variant": "attention", "two_way": True}),
    ("rocktaschel", {"variant": "word_by_word", "delimiter_id": 22}),
    ("rocktaschel", {"variant": "word_by_word", "two_way": True, "shared_encoder": True}),
    ("cam", {"variant": "full"}), ("cam", {"variant": "intra_only"}), ("cam", {"variant": "inter_only"}),
]


@pytest.mark.parametrize("name,config", EVERY_STACKED_ARCHITECTURE)
def test_stacked_logits_and_gradients_are_each_members(name, config):
    """Logits of the stack's forward (the LSTMs run stepwise, word-by-word attention by its
    equations) equal each member's solo forward; so do the gradients of every stacked parameter;
    a member's state_dict loads into a solo model."""
    members = [_build(name, config, seed=seed) for seed in (0, 1, 2)]
    stack = StackedModel(members).eval()
    batch = random_batch((7, 3, 5, 2), (4, 6, 2, 5), low=1, high=22, seed=0)
    logits = stack(*batch)
    assert logits.shape == (3, 4, 3)
    upstream = torch.randn_like(logits)
    names = list(stack.stacked_parameters())
    grads = torch.autograd.grad(logits, list(stack.stacked_parameters().values()), upstream)
    for i, member in enumerate(members):
        torch.testing.assert_close(logits[i], member.eval()(*batch), rtol=1e-5, atol=1e-6)
        parameters = dict(member.named_parameters())
        solo_grads = torch.autograd.grad(member(*batch), [parameters[n] for n in names], upstream[i])
        for parameter, got, want in zip(names, grads, solo_grads, strict=True):
            torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-6, msg=lambda m, p=parameter: f"{p}: {m}")
        solo = _build(name, config, seed=99)
        solo.load_state_dict(stack.member_state_dict(i))
        torch.testing.assert_close(solo.eval()(*batch), member(*batch), rtol=0, atol=0)


@pytest.mark.parametrize("name,config", [
    ("decomposable", {"variant": "intra", "dropout": 0.2}), ("abcnn", {"variant": "abcnn3", "nonover": True}),
    ("rocktaschel", {"variant": "word_by_word", "two_way": True, "dropout": 0.1}), ("cam", {"variant": "full"}),
])
@pytest.mark.parametrize("per_member", [False, True], ids=["shared_batch", "batch_per_member"])
def test_a_stacked_step_reads_nothing_on_the_host_off_the_cpu(name, config, per_member, request):
    """The meta device takes the models' off-CPU (GPU) branches: forward, backward and the
    per-member optimizer's step of a stack read no value on the host (building the stack may),
    on one batch for both members or a batch each ([2, B, L] inputs: seeds that differ)."""
    stack = StackedModel([_build(name, config, seed=seed) for seed in (0, 1)]).train().to("meta")
    optimizer = make_stacked_optimizer(stack, [TrainingConfig(optimizer="adam", lr=lr) for lr in (0.1, 0.01)])
    inputs = [torch.stack([a, b]) for a, b in zip(_batch(0), _batch(1), strict=True)] if per_member else _batch()
    request.getfixturevalue("host_reads_raise")
    logits = stack(*(t.to("meta") for t in inputs))
    assert logits.shape[:2] == (2, len(_batch()[0]))
    logits.sum().backward()
    optimizer.step(torch.tensor([True, False], device="meta"))
    assert all(state["exp_avg"].device.type == "meta" for state in optimizer.state.values())


@pytest.mark.parametrize("per_member", [False, True], ids=["shared_batch", "batch_per_member"])
def test_a_sentence_longer_than_max_length_is_refused_by_name_in_a_stack(per_member):
    """ABCNN-1/3's W_0 has max_length columns: a stack refuses a longer sentence with the solo
    model's error, also where each member has a batch of its own (checked outside vmap, whose
    batched masks neither a host read nor a device-side assertion can take)."""
    stack = StackedModel([_build("abcnn", {"variant": "abcnn1", "max_length": 6}, seed=s) for s in (0, 1)])
    long, fitting = _batch(), _batch(1)  # the longest premise of _batch() has 7 tokens
    fitting = (fitting[0][:, :6], fitting[1][:, :6], *fitting[2:])
    per_row = max(long[0].shape[1], fitting[0].shape[1])

    def padded(batch):
        return (F.pad(batch[0], (0, per_row - batch[0].shape[1])), F.pad(batch[1], (0, per_row - batch[1].shape[1])),
                *batch[2:])
    inputs = ([torch.stack([a, b]) for a, b in zip(padded(fitting), padded(long), strict=True)]
              if per_member else long)
    with pytest.raises(ValueError, match="7 tokens but the model was built with max_length=6"):
        stack(*inputs)
    ok = [torch.stack([a, a]) for a in padded(fitting)] if per_member else fitting
    assert stack(*ok).shape[0] == 2  # padding beyond max_length is fine


@pytest.mark.parametrize("per_member", [False, True], ids=["shared_batch", "batch_per_member"])
def test_off_the_cpu_a_stack_checks_lengths_without_a_host_read(per_member, request):
    """Off the CPU the length check is a device-side assertion (the meta device takes that
    branch): a stack of ABCNN-1 on batches wider than max_length reads nothing on the host
    (building the stack may)."""
    stack = StackedModel([_build("abcnn", {"variant": "abcnn1", "max_length": 6}, seed=s) for s in (0, 1)])
    stack = stack.to("meta")
    batch = [t.to("meta") for t in _batch()]  # 7 columns
    inputs = [torch.stack([t, t]) for t in batch] if per_member else batch
    request.getfixturevalue("host_reads_raise")
    assert stack(*inputs).shape[:2] == (2, len(batch[0]))


@pytest.mark.parametrize("tuned_rows", [0, 5])
def test_a_fixed_embedding_table_is_shared_not_stacked(tuned_rows):
    """Parikh and Yin keep the word vectors fixed: one table for the stack, not k copies; rows
    that are tuned (an oov policy's) are each member's own."""
    table = torch.randn(24, 8)
    trainable = torch.arange(24) < tuned_rows
    members = [_build("decomposable", {"variant": "vanilla"}, seed=seed) for seed in (0, 1)]
    for member in members:
        member.word_embeddings.load(table, trainable)
    stack = StackedModel(members).eval()
    assert "word_embeddings.embedding.weight" in stack.shared_names
    assert "null_embedding" in stack.stacked_names  # a random buffer: one per member's seed
    tuned = [name for name in stack.stacked_parameters() if name.startswith("word_embeddings.")]
    assert tuned == (["word_embeddings.tuned_weight"] if tuned_rows else [])
    batch = random_batch((5, 3), (4, 6), low=1, high=24, seed=1)
    for i, member in enumerate(members):
        torch.testing.assert_close(stack(*batch)[i], member.eval()(*batch), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width,padding", [(3, 2), (2, 1), (3, 0)])
def test_windowed_convolution_is_the_wide_convolution(width, padding):
    """Output and gradients (input, weight, bias) of nn.Conv1d: alone, and under vmap over
    members with their own weights (the stack's batched taps and tap sum)."""
    torch.manual_seed(0)
    convs = [torch.nn.Conv1d(5, 4, width, padding=padding) for _ in range(3)]
    x = torch.randn(3, 2, 5, 7, requires_grad=True)
    expected = torch.stack([conv(x[i]) for i, conv in enumerate(convs)])
    grad = torch.randn_like(expected)
    weights = [p for conv in convs for p in (conv.weight, conv.bias)]
    expected_grads = torch.autograd.grad(expected, [x, *weights], grad)
    windowed = WindowedConv1d(convs[0])
    torch.testing.assert_close(windowed(x[0]), expected[0], rtol=1e-5, atol=1e-6)
    solo_grads = torch.autograd.grad(windowed(x[0]), [x, convs[0].weight, convs[0].bias], grad[0])
    for got, want in zip((solo_grads[0][0], *solo_grads[1:]), (expected_grads[0][0], *expected_grads[1:3]),
                         strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    stacked = {name: torch.stack([getattr(conv, name) for conv in convs]).detach().requires_grad_()
               for name in ("weight", "bias")}
    members = torch.vmap(lambda tensors, xi: torch.func.functional_call(windowed, tensors, (xi,)))(stacked, x)
    torch.testing.assert_close(members, expected, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(members, [x, stacked["weight"], stacked["bias"]], grad)
    torch.testing.assert_close(got[0], expected_grads[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], torch.stack(expected_grads[1::2]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], torch.stack(expected_grads[2::2]), rtol=1e-5, atol=1e-5)


def test_stack_dropout_is_the_models_dropout():
    """Alone, StackDropout draws layers.Dropout's masks (the same draw, thresholded and scaled):
    equal outputs and gradients for one seed. Under vmap each member draws its own, a member from
    the same law (about 1 - p kept, scaled by 1 / (1 - p)); with randomness="same", one for all."""
    x = torch.randn(6, 500, requires_grad=True)
    outputs = []
    for module in (layers.Dropout(0.3), StackDropout(0.3)):
        torch.manual_seed(4)
        out = module.train()(x)
        outputs.append((out, torch.autograd.grad(out.sum(), x)[0]))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    members = torch.vmap(StackDropout(0.3).train(), randomness="different")(torch.ones(4, 6, 500))
    assert len({tuple(member.flatten().tolist()) for member in members}) == 4
    torch.testing.assert_close(members.unique(), torch.tensor([0.0, 1 / 0.7]))
    assert abs((members != 0).float().mean().item() - 0.7) < 0.02
    same = torch.vmap(StackDropout(0.3).train(), randomness="same")(torch.ones(4, 6, 500))
    assert all(torch.equal(member, same[0]) for member in same)


def test_what_is_not_one_registered_architecture_is_refused():
    with pytest.raises(ValueError, match="stacked models are decomposable, abcnn, rocktaschel, cam"):
        StackedModel([torch.nn.Linear(3, 3)])
    members = [build_model(name, vocab_size=24, embedding_dim=8, num_classes=3, hidden_size=8)
               for name in ("rocktaschel", "cam")]
    with pytest.raises(ValueError, match="one architecture"):
        StackedModel(members)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("initial_state", [False, True])
def test_a_stepwise_lstm_is_the_held_and_packed_runs(bidirectional, initial_state):
    """run_lstm and run_lstm_outputs on a StepwiseLSTM (the stack's LSTM) give the nn.LSTM's
    results (held or packed: the state after each row's last real token, zero outputs at padding)
    and gradients, alone and under vmap over members with their own weights."""
    torch.manual_seed(0)
    lstms = [torch.nn.LSTM(5, 4, batch_first=True, bidirectional=bidirectional) for _ in range(3)]
    directions = 2 if bidirectional else 1
    x = torch.randn(3, 4, 6, 5, requires_grad=True)
    mask = torch.arange(6) < torch.tensor([6, 2, 4, 1]).unsqueeze(1)
    state = tuple(torch.randn(directions, 4, 4) for _ in range(2)) if initial_state else None

    def outputs(lstm, xi):
        out, (h, c) = layers.run_lstm(lstm, xi, mask, state)
        if bidirectional:
            return out, h, c
        return (out, h, c, *layers.run_lstm_outputs(lstm, xi, mask, state))

    expected = [outputs(lstm, x[i]) for i, lstm in enumerate(lstms)]
    stepwise = StepwiseLSTM(lstms[0])
    names = [name for name, _ in lstms[0].named_parameters()]
    assert [name for name, _ in stepwise.named_parameters()] == names
    with pytest.raises(TypeError, match="run_lstm"):  # it needs the mask: run_lstm passes it
        stepwise(x[0])
    for got, want in zip(outputs(stepwise, x[0]), expected[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    class Runs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = stepwise

        def forward(self, xi):
            return outputs(self.lstm, xi)

    stacked = {"lstm." + name: torch.stack([getattr(lstm, name) for lstm in lstms]).detach().requires_grad_()
               for name in names}
    members = torch.vmap(lambda tensors, xi: torch.func.functional_call(Runs(), tensors, (xi,)))(stacked, x)
    upstream = [torch.randn_like(t) for t in members]
    got = torch.autograd.grad(members, [x, *stacked.values()], upstream)
    for i, lstm in enumerate(lstms):
        for member, want in zip(members, expected[i], strict=True):
            torch.testing.assert_close(member[i], want, rtol=1e-5, atol=1e-6)
        want = torch.autograd.grad(expected[i], [x, *lstm.parameters()], [u[i] for u in upstream])
        torch.testing.assert_close(got[0][i], want[0][i], rtol=1e-4, atol=1e-6)
        for stacked_grad, solo_grad in zip(got[1:], want[1:], strict=True):
            torch.testing.assert_close(stacked_grad[i], solo_grad, rtol=1e-4, atol=1e-6)


def test_configurations_that_differ_in_shape_do_not_stack():
    configs = _configs("decomposable", "adam")
    wider = toy_run_config({**MODELS["decomposable"], "args": {**MODELS["decomposable"]["args"], "hidden_size": 16}},
                           TOY, lr=0.01)
    with pytest.raises(ValueError, match="cannot join the stack"):
        check_stackable([configs[0], wider])
    check_stackable(configs)  # lr, ℓ2 and seed may differ
    with pytest.raises(ValueError, match="layerwise"):
        check_stackable([c.model_copy(update={"training": c.training.model_copy(update={"layerwise": True})})
                         for c in _configs("abcnn3", "adagrad")])


# -- faithful members ---------------------------------------------------------------------------

@pytest.mark.parametrize("model,optimizer", [
    ("decomposable", "adam"), ("decomposable", "adagrad"), ("decomposable_intra", "adam"), ("abcnn3", "adagrad"),
    ("word_by_word", "adam"), ("conditional_shared", "adam"), ("cam", "adam"),
])
def test_each_members_losses_are_its_solo_runs(model, optimizer, toy, one_thread):
    """Members differing in lr, ℓ2 and seed: 20 steps, each member's loss equals the solo
    Trainer's (make_trainer: its seed, its make_optimizer) on the same batches, to 1e-5."""
    configs = _configs(model, optimizer)
    batches = _batches(toy)
    stack = StackedTrainer(configs, toy)
    stacked = torch.stack([stack.training_step(batch)[0] for batch in batches])
    for i, config in enumerate(configs):
        solo = make_trainer(config, toy)
        losses = torch.stack([solo.training_step(batch)[0].detach() for batch in batches])
        torch.testing.assert_close(stacked[:, i], losses, rtol=1e-5, atol=1e-5)
    # Members 0 and 1 share the seed: one first loss, then their own lr and ℓ2 take them apart.
    assert stacked[0, 0] == stacked[0, 1] and (stacked[1:, 0] != stacked[1:, 1]).all()


@pytest.mark.parametrize("model,optimizer", [
    ("decomposable_intra", "adam"), ("abcnn3", "adagrad"), ("word_by_word", "adam"), ("cam", "adam"),
])
def test_members_of_several_seeds_train_on_their_own_batches(model, optimizer, toy, one_thread):
    """Seeds stack: each member draws its solo run's batch order (the stack pads the members'
    batches to one shape; a shorter batch's extra rows count in no loss), so after an epoch
    (two, bucketed: a short batch somewhere in each order) a member's weights, train loss and
    dev result are its solo run's."""
    configs = [c.model_copy(update={"training": c.training.model_copy(update={"epochs": 2, "batch_size": 14})})
               for c in _configs(model, optimizer, ((0.01, 0.0, 1), (0.05, 1e-3, 2), (0.02, 1e-2, 7)))]
    assert len(toy.splits["train"]) % 14
    stack = StackedTrainer(configs, toy)
    assert stack.batch_seeds == [1, 2, 7]
    states = stack.fit()
    for i, config in enumerate(configs):
        solo = make_trainer(config, toy)
        expected = solo.fit()
        for got, want in zip(states[i].history, expected.history, strict=True):
            assert got.train_loss == pytest.approx(want.train_loss, rel=1e-5, abs=1e-6)
            assert got.train_accuracy == pytest.approx(want.train_accuracy, abs=1e-6)
            assert got.dev_loss == pytest.approx(want.dev_loss, rel=1e-5, abs=1e-6)
            assert got.dev_accuracy == want.dev_accuracy
        member = stack.model.member_state_dict(i)
        for name, tensor in solo.model.state_dict().items():
            # The stack's batches run the off-CPU path (test_host_sync: equal to float rounding), and
            # Adam's normalised step turns rounding in a near-zero gradient into ~1e-5 of weight.
            torch.testing.assert_close(member[name], tensor, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_with_dropout_each_member_draws_its_own_masks(toy, one_thread):
    same = ((0.01, 0.0, 1), (0.01, 0.0, 1))  # two identical members
    stack = StackedTrainer(_configs("decomposable", "adam", same, dropout=0.5), toy)
    batch = _batches(toy, 1)[0]
    stack.model.train()
    logits = stack.model(*batch.inputs())
    assert not torch.allclose(logits[0], logits[1])
    stack.model.eval()
    logits = stack.model(*batch.inputs())
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)


def test_members_with_their_own_dropout_rates_draw_at_them(toy, one_thread):
    """A grid over dropout stacks: each member masks at its own rate (a member at 0 computes its
    solo model's logits in training mode), and its weights load into its solo model."""
    rates = (0.0, 0.25, 0.5)
    configs = [toy_run_config({**MODELS["word_by_word"], "args": {**MODELS["word_by_word"]["args"], "dropout": p}},
                              TOY, lr=0.01, seed=1, batch_size=8, device="cpu") for p in rates]
    check_stackable(configs)
    stack = StackedTrainer(configs, toy)
    assert stack.model.rate_names == ["dropout.rate"]
    batch = _batches(toy, 1)[0]
    solo = make_trainer(configs[0], toy)
    solo.model.train()
    stack.model.train()
    torch.testing.assert_close(stack.model(*batch.inputs())[0], solo.model(*batch.inputs()), rtol=1e-5, atol=1e-6)
    # The masks themselves, on a template dropout's own input: the fraction kept is each member's 1 - p.
    dropout = stack.model.template.dropout
    kept = torch.vmap(lambda rate: torch.func.functional_call(dropout, {"rate": rate}, (torch.ones(20_000),)),
                      randomness="different")(stack.model.member_tensors.dropout__rate)
    for member, p in zip(kept, rates, strict=True):
        assert abs((member != 0).float().mean().item() - (1 - p)) < 0.02
        torch.testing.assert_close(member.unique(), torch.tensor([0.0, 1 / (1 - p)]).unique()[int(p == 0):])
    for i, config in enumerate(configs):
        make_trainer(config, toy).model.load_state_dict(stack.model.member_state_dict(i))


def _member_slice(stack: StackedTrainer, member: int) -> list[torch.Tensor]:
    tensors = [p[member].clone() for p in stack.model.stacked_parameters().values()]
    for state in stack.optimizer.state.values():
        tensors += [v[member].clone() for v in state.values()]
    return tensors


@pytest.mark.parametrize("how", ["stopped", "diverged"])
def test_a_stopped_or_diverged_member_stays_and_the_others_train_on(how, toy, one_thread):
    """After 3 steps member 1 is stopped (a scheduler's decision) or made NaN (its next loss is
    NaN): its parameters and optimizer state do not change any more, and the other members'
    losses are those of a stack where nothing happened."""
    configs = _configs("abcnn3", "adagrad")
    batches = _batches(toy, 8)
    reference = StackedTrainer(configs, toy)
    expected = torch.stack([reference.training_step(batch)[0] for batch in batches])
    stack = StackedTrainer(configs, toy)
    losses = [stack.training_step(batch)[0] for batch in batches[:3]]
    if how == "stopped":
        stack.stop(1)
    else:
        with torch.no_grad():
            stack.model.stacked_parameters()["output.weight"][1] = float("nan")
    frozen = _member_slice(stack, 1)
    losses += [stack.training_step(batch)[0] for batch in batches[3:]]
    losses = torch.stack(losses)
    assert stack.active.tolist() == [True, False, True]
    for before, after in zip(frozen, _member_slice(stack, 1), strict=True):
        torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(losses[:, [0, 2]], expected[:, [0, 2]], rtol=0, atol=0)
    assert torch.isnan(losses[3:, 1]).all() == (how == "diverged")


def test_fit_reports_each_member_and_stops_a_diverged_one_alone(toy, one_thread):
    configs = [c.model_copy(update={"training": c.training.model_copy(update={"epochs": 2})})
               for c in _configs("decomposable", "adam")]
    stack = StackedTrainer(configs, toy)
    with torch.no_grad():
        stack.model.stacked_parameters()["output.weight"][2] = float("inf")
    reported = []
    states = stack.fit(lambda trainer, results: reported.append(results))
    assert len(reported) == 2
    assert [r is None for r in reported[0]] == [False, False, True]
    assert stack.stop_reasons == [None, None, "diverged"]
    assert [len(state.history) for state in states] == [2, 2, 0]
    assert all(0 <= r.dev_accuracy <= 1 and r.train_loss > 0 for r in reported[1][:2])
    assert stack.best_model_states[0] is not None and stack.best_model_states[2] is None


def test_each_members_dev_evaluation_is_its_solo_evaluation(toy, one_thread):
    configs = _configs("decomposable_intra", "adagrad")
    batches = _batches(toy, 5)
    stack = StackedTrainer(configs, toy)
    for batch in batches:
        stack.training_step(batch)
    stacked = stack.evaluate("dev")
    for i, config in enumerate(configs):
        solo = make_trainer(config, toy)
        for batch in batches:
            solo.training_step(batch)
        expected = solo.evaluate("dev")
        assert stacked[i].accuracy == expected.accuracy
        assert (stacked[i].predictions == expected.predictions).all()
        assert stacked[i].loss == pytest.approx(expected.loss, rel=1e-5)


def test_a_stack_resumes_exactly_from_its_state(toy, one_thread, tmp_path):
    """Saved after 3 steps (through torch.save / weights_only load), a new stack continues with
    the losses of the stack that went on, dropout's masks included."""
    configs = _configs("abcnn3", "adam", dropout=0.3)
    batches = _batches(toy, 6)
    stack = StackedTrainer(configs, toy)
    for batch in batches[:3]:
        stack.training_step(batch)
    stack.stop(2)
    torch.save(stack.state_dict(), tmp_path / "stack.pt")
    expected = torch.stack([stack.training_step(batch)[0] for batch in batches[3:]])
    resumed = StackedTrainer(configs, toy)
    resumed.load_state_dict(torch.load(tmp_path / "stack.pt", weights_only=True))
    assert resumed.active.tolist() == [True, True, False] and resumed.stop_reasons[2] == "stopped"
    losses = torch.stack([resumed.training_step(batch)[0] for batch in batches[3:]])
    torch.testing.assert_close(losses, expected, rtol=0, atol=0)
