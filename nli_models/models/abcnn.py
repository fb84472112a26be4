"""Yin et al. (2016), "ABCNN: Attention-Based Convolutional Neural Network for Modeling Sentence
Pairs" — the neural part of the textual-entailment (SICK) setup.

Each convolution-pooling block (``num_blocks`` of them, the paper's one-conv / two-conv) applies
a wide convolution with tanh (eq. 1) to both sentences with shared weights, then w-ap pooling back
to the input length. ABCNN-1 feeds an attention feature map W·A (eq. 2-4) into the convolution
as a second channel, ABCNN-2 replaces w-ap by attention-weighted pooling (§4.2), ABCNN-3 does
both. A uses the match-score 1/(1 + |x - y|) (Euclidean). As in §5.1.1 every block — the input
block b_1 of word vectors included — all-ap pools both sentences, and the two sentence vectors
give two similarity scores (§5.4.1: cosine and Euclidean distance); the 2 x (num_blocks + 1)
scores feed a logistic-regression (linear + softmax) output layer.

Choices the paper leaves open:
- Padding is masked (the paper pads both sentences with zero columns and lets them into the
  averages); a sentence of n words has n + w - 1 convolution columns and pooling sees only those.
- ABCNN-1's W_0 = W_1 (footnote 2) is d x s: its columns index positions of the other sentence,
  so s is a fixed ``max_length``; longer sentences raise.
- In ABCNN-2/3 the all-ap that feeds the output layer is attention-weighted too (the mean of
  a_k F^c[:, k] over the block's columns): with an unweighted all-ap a one-block ABCNN-2 would be
  exactly BCNN, since its attention has no parameters and would reach nothing else.
- Dropout (not used in the paper) applies to the word vectors.
Layerwise training (§5.1.2: train block 1, freeze it, add block 2 and train it, ...) is the
trainer's ``training.layerwise``; ``train_blocks_up_to(k)`` runs the network of the first k
blocks, with only block k trainable. The phase-k network's LR layer is the first 2 x (k + 1)
columns of the final one (the paper builds a new LR layer per phase; ours carries the learned
columns over, so |θ|M is the final network's).
NONOVER (§5.4, ``nonover``): a second copy of the network (its own blocks) reads each pair with
the words that occur in both sentences removed, and its scores join the ORIG copy's in the one
LR layer. Words are compared by vocabulary id, so case-sensitively with ``data.lowercase: false``
as in Table 5 (the shared sentence-initial "A" goes, "a full" keeps its lowercase "a"). A sentence
left empty is the single token <unk>
(the paper's "<empty>": one fixed random vector under ``single_unk``). The LR columns are
ordered block by block (ORIG then NONOVER per block), so layerwise phase k still uses a prefix.
The two copies run as one batch of 2B pairs (ORIG's, then NONOVER's), each block of both at once
(``_BlockCopies``): every op without weights runs once, and each copy's weights act on its own
rows (one batched product; a convolution per copy on a CPU, one grouped convolution off it).
Not implemented: the 24 linguistic features and the SVM/LR retrained on the scores after
training (§5.1.3, §5.4).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nli_models.data.text import UNK_INDEX
from nli_models.embeddings import PAD_INDEX, WordEmbeddings
from nli_models.models import layers
from nli_models.models.arguments import ModelArguments, Rate, Size, variant_of
from nli_models.models.layers import Dropout, masked_mean, on_both_sentences, same_length
from nli_models.models.pair_classifier import PairClassifier, Sentences
from nli_models.registry import PaperConfig, register_model

_SCORES_PER_BLOCK = 2  # cosine similarity and Euclidean distance (§5.4.1)
VARIANTS = ("bcnn", "abcnn1", "abcnn2", "abcnn3")
ATTENTION_INPUT_VARIANTS = ("abcnn1", "abcnn3")  # attention on the input: W_0 has max_length columns


class ABCNNArguments(ModelArguments):
    variant: variant_of(*VARIANTS) = "abcnn3"
    hidden_size: Size = 50
    dropout: Rate = 0.0
    filter_width: Size = 3
    num_blocks: Size = 1
    max_length: Size = 40
    nonover: bool = False


def euclidean_match(
    x0: torch.Tensor, x1: torch.Tensor, mask0: torch.Tensor, mask1: torch.Tensor
) -> torch.Tensor:
    """Eq. 2: A[i, j] = 1 / (1 + |x0_i - x1_j|) for [B, L0, D], [B, L1, D]; 0 where either is padding."""
    # cdist: one kernel forward and one backward (the expanded |a|^2 + |b|^2 - 2ab took about
    # twenty); its gradient where two units coincide is 0, as a clamped sqrt's is.
    match = 1 / (1 + torch.cdist(x0, x1))
    return match * (mask0.unsqueeze(2) & mask1.unsqueeze(1))


def _window_sum(values: torch.Tensor, width: int) -> torch.Tensor:
    """[B, L + w - 1, D] -> [B, L, D]: column j sums columns j .. j + w - 1 (w-ap without the 1/w)."""
    return F.avg_pool1d(values.transpose(1, 2), width, stride=1).transpose(1, 2) * width


def _similarity_scores(u0: torch.Tensor, u1: torch.Tensor) -> torch.Tensor:
    # vector_norm's gradient at a zero difference is 0, as a clamped sqrt's is; fewer kernels.
    distance = torch.linalg.vector_norm(u0 - u1, dim=-1)
    return torch.stack([F.cosine_similarity(u0, u1, dim=-1), distance], dim=-1)


def nonoverlapping(sentence: Sentences, other: Sentences) -> Sentences:
    """NONOVER (§5.4, Table 5): ``sentence`` without the words that occur in ``other``, left-aligned;
    a sentence left with no word becomes the single token <unk> (the paper's <empty>)."""
    shared = (sentence.ids.unsqueeze(2) == other.ids.unsqueeze(1)) & other.mask.unsqueeze(1)
    keep = sentence.mask & ~shared.any(dim=2)
    # A stable sort on "dropped" moves the kept words to the front in their order.
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    keep = keep.gather(1, order)
    ids = sentence.ids.gather(1, order).masked_fill(~keep, PAD_INDEX)
    empty = ~keep[:, 0]
    ids[:, 0] = torch.where(empty, torch.full_like(ids[:, 0], UNK_INDEX), ids[:, 0])
    keep[:, 0] = True
    if not layers.on_host(keep):  # read through the module: one switch for every model
        # The longest kept row's length is a host read: off the CPU the padded length stays (the
        # extra columns are padding, which every block masks).
        return Sentences(ids, keep)
    length = int(keep.sum(dim=1).max())
    return Sentences(ids[:, :length], keep[:, :length])


def _with_copy(sentences: Sentences, copy: Sentences) -> Sentences:
    """Both batches as one, ``copy``'s rows after ``sentences``' (padded to their length: on the
    CPU ``nonoverlapping`` cuts its result to its longest row)."""
    extra = sentences.ids.shape[1] - copy.ids.shape[1]
    if extra:
        copy = Sentences(F.pad(copy.ids, (0, extra), value=PAD_INDEX),
                         F.pad(copy.mask, (0, extra), value=False))
    return Sentences(torch.cat([sentences.ids, copy.ids]), torch.cat([sentences.mask, copy.mask]))


class _Block(nn.Module):
    """The weights of one convolution-pooling block of one copy of the network (Figure 3);
    ``_BlockCopies`` applies them."""

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        width: int,
        attention_input: bool,
        attention_pooling: bool,
        max_length: int,
    ):
        super().__init__()
        self.width = width
        self.attention_pooling = attention_pooling
        # Eq. 3-4, W_0 = W_1 (footnote 2); the attention map is a second input channel. Drawn
        # like an nn.Linear's weight over max_length inputs.
        bound = max_length**-0.5
        self.attention_weight = (
            nn.Parameter(torch.empty(input_dim, max_length).uniform_(-bound, bound))
            if attention_input
            else None
        )
        channels = 2 if attention_input else 1
        self.conv = nn.Conv1d(channels * input_dim, output_dim, width, padding=width - 1)


def _stacked(weights: list[torch.Tensor]) -> torch.Tensor:
    """[copies, *shape]; a single copy's weight as a view (stack would copy it)."""
    return weights[0].unsqueeze(0) if len(weights) == 1 else torch.stack(weights)


def _feature_map(match: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Eq. 3 (eq. 4 with A transposed) for every copy at once: column i of F_a is W A[i, :].
    ``match`` [copies x B, L, L'] (copy-major), ``weight`` the copies' W [copies, D, max_length]
    -> [copies x B, L, D]. Padding columns of A are zero, so only W's first L' columns count."""
    copies, rows, length = weight.shape[0], match.shape[1], match.shape[2]
    product = torch.bmm(match.reshape(copies, -1, length), weight[:, :, :length].transpose(1, 2))
    return product.view(match.shape[0], rows, -1)


def convolves_copies_apart(x: torch.Tensor) -> bool:
    """Whether the copies' convolutions run one per copy rather than as one grouped convolution:
    on a CPU, where oneDNN runs a grouped convolution several times slower than separate ones
    (nli_models.stacked.model), also on the off-CPU path (a stack of several seeds on a CPU: the
    grouped convolution was 38% of its step). tests/test_host_sync.py checks the two agree."""
    return x.device.type == "cpu"


class _BlockCopies:
    """Block i of every copy of the network (ORIG, and NONOVER with its own weights), applied to
    both sentences of every copy at once: each sentence's values hold the copies' batches in
    turn along dim 0 (copy-major, ``batch`` rows each), so every op without weights (match
    scores, pooling, masks) runs once for all copies; the attention feature map is one batched
    product over the copies' stacked W, and the convolution one grouped one (a CPU: one per copy)."""

    def __init__(self, blocks: list[_Block], batch: int):
        self.blocks, self.batch = blocks, batch
        self.width, self.attention_pooling = blocks[0].width, blocks[0].attention_pooling
        self.attention_weight = (None if blocks[0].attention_weight is None
                                 else _stacked([block.attention_weight for block in blocks]))

    def __call__(self, x0, mask0, x1, mask1):
        """x [copies x B, L, D] (zero at padding), mask [copies x B, L] -> (w-ap outputs, all-ap
        vectors, attention maps), each over every copy."""
        attention = {}
        if self.attention_weight is not None:
            a = euclidean_match(x0, x1, mask0, mask1)  # eq. 2, [copies x B, L0, L1]
            attention["input"] = a
            f0 = _feature_map(a, self.attention_weight)  # eq. 3
            f1 = _feature_map(a.transpose(1, 2), self.attention_weight)  # eq. 4
            x0, x1 = torch.cat([x0, f0], dim=-1), torch.cat([x1, f1], dim=-1)
        # The convolution's weights are shared by both sentences: one pass over both.
        (c0, conv_mask0), (c1, conv_mask1) = on_both_sentences(self._convolve, (x0, mask0), (x1, mask1))
        if self.attention_pooling:
            a = euclidean_match(c0, c1, conv_mask0, conv_mask1)
            attention["conv"] = a
            # §4.2: a unit's weight is the sum of its row (s_0) or column (s_1) of A.
            c0 = c0 * a.sum(dim=2, keepdim=True)
            c1 = c1 * a.sum(dim=1).unsqueeze(-1)
        (pooled0, summary0), (pooled1, summary1) = on_both_sentences(
            self._pool, (c0, conv_mask0, mask0), (c1, conv_mask1, mask1))
        return (pooled0, pooled1), (summary0, summary1), attention

    def _pool(self, columns: torch.Tensor, conv_mask: torch.Tensor, mask: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """w-ap back to the input's positions (zero at padding) and all-ap (the masked mean) of a
        sentence's convolution columns [N, L + w - 1, D']."""
        pooled = _window_sum(columns, self.width)
        if not self.attention_pooling:
            pooled = pooled / self.width
        return pooled * mask.unsqueeze(-1), masked_mean(columns, conv_mask)

    def _convolve(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Wide convolution (eq. 1) -> ([N, L + w - 1, D'], mask of each row's n + w - 1 columns)."""
        columns = torch.tanh(self._wide_convolution(x))
        # Columns past a row's n + w - 1 see only zero padding; every consumer (match scores,
        # all-ap, and w-ap whose windows for the n real outputs end at column n + w - 2) skips them.
        positions = torch.arange(columns.shape[1], device=x.device)
        conv_mask = positions.unsqueeze(0) < mask.sum(dim=1, keepdim=True) + self.width - 1
        return columns, conv_mask

    def _wide_convolution(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 1 before the tanh: each copy's rows of x [N, L, D] through that copy's convolution
        -> [N, L + w - 1, D']. N is (sentences, copies, batch), sentences 1 on the CPU (one call
        per sentence, ``on_both_sentences``) and 2 off it."""
        convs = [block.conv for block in self.blocks]
        copies, (rows, length, dim) = len(convs), x.shape
        if copies == 1:
            return convs[0](x.transpose(1, 2)).transpose(1, 2)
        if convolves_copies_apart(x):
            # Each copy's rows through its own convolution. [sentences, copies, batch, L, D];
            # sentences 1 on the host path.
            by_copy = x.view(-1, copies, self.batch, length, dim)
            parts = [conv(by_copy[:, c].flatten(0, 1).transpose(1, 2)).unflatten(0, (-1, self.batch))
                     for c, conv in enumerate(convs)]
            return torch.stack(parts, dim=1).flatten(0, 2).transpose(1, 2)
        # One grouped convolution: copy c's channels are group c. [sentences, copies, batch, L, D]
        # -> [sentences x batch, copies x D, L], and back.
        grouped = x.view(-1, copies, self.batch, length, dim).permute(0, 2, 1, 4, 3)
        weight, bias = torch.cat([conv.weight for conv in convs]), torch.cat([conv.bias for conv in convs])
        out = F.conv1d(grouped.reshape(-1, copies * dim, length), weight, bias,
                       padding=self.width - 1, groups=copies)
        columns = out.shape[-1]
        by_copy = out.view(-1, self.batch, copies, out.shape[1] // copies, columns).permute(0, 2, 1, 4, 3)
        return by_copy.reshape(rows, columns, -1)


def _paper_config(variant: str, num_blocks: int) -> PaperConfig:
    name = {"bcnn": "BCNN", "abcnn1": "ABCNN-1", "abcnn2": "ABCNN-2", "abcnn3": "ABCNN-3"}[variant]
    conv = {1: "one-conv", 2: "two-conv"}[num_blocks]
    notes = "Yin et al. publish no parameter counts. The ORIG and NONOVER copies (§5.4) without "
    notes += "the 24 linguistic features, so the LR layer sees 2 x 2 x (num_blocks + 1) scores."
    if variant in ("abcnn1", "abcnn3"):
        notes += " W_0 (d x max_length per block) makes |θ|M depend on max_length."
    return PaperConfig(
        model="abcnn",
        config={
            "embedding_dim": 300,
            "num_classes": 3,
            "variant": variant,
            "hidden_size": 50,
            "filter_width": 3,
            "num_blocks": num_blocks,
            "nonover": True,
        },
        paper="yin2016",
        table_row=f"Table 6 (SICK): {name} {conv}",
        published_theta_m=None,
        notes=notes,
    )


@register_model("abcnn")
class ABCNN(PairClassifier):
    Arguments = ABCNNArguments
    PAPER_CONFIGS = tuple(_paper_config(v, n) for v in VARIANTS for n in (1, 2))

    def __init__(self, **arguments: Any):
        """``arguments``: the fields of ABCNNArguments, validated here."""
        super().__init__()
        args = self.Arguments.parse(arguments, self.registered_name)
        hidden_size, num_blocks = args.hidden_size, args.num_blocks
        self.max_length = args.max_length
        self.attention_input = args.variant in ATTENTION_INPUT_VARIANTS
        self.word_embeddings = WordEmbeddings(args.vocab_size, args.embedding_dim)
        self.dropout = Dropout(args.dropout)
        def stack() -> nn.ModuleList:
            return nn.ModuleList(
                _Block(
                    args.embedding_dim if i == 0 else hidden_size,
                    hidden_size,
                    args.filter_width,
                    attention_input=self.attention_input,
                    attention_pooling=args.variant in ("abcnn2", "abcnn3"),
                    max_length=args.max_length,
                )
                for i in range(num_blocks)
            )

        self.blocks = stack()
        self.nonover_blocks = stack() if args.nonover else None
        copies = 2 if args.nonover else 1
        self.output = nn.Linear(
            copies * _SCORES_PER_BLOCK * (num_blocks + 1), args.num_classes
        )
        self.active_blocks = num_blocks

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def train_blocks_up_to(self, k: int) -> None:
        """Layerwise phase k: the network of blocks 1..k, blocks before k frozen (§5.1.2)."""
        if not 1 <= k <= self.num_blocks:
            raise ValueError(f"phase {k} of a {self.num_blocks}-block network")
        self.active_blocks = k
        for stack in (self.blocks, self.nonover_blocks or ()):
            for i, block in enumerate(stack, start=1):
                block.requires_grad_(i == k)

    def classify(self, premise: Sentences, hypothesis: Sentences):
        """Attention maps are [B, Lh, Lp] ("block{i}_input", ABCNN-1/3) and
        [B, Lh + w - 1, Lp + w - 1] over convolution columns ("block{i}_conv", ABCNN-2/3)."""
        if self.attention_input:
            premise, hypothesis = self._fit(premise), self._fit(hypothesis)
        lengths = {"premise": premise.ids.shape[1], "hypothesis": hypothesis.ids.shape[1]}
        # Off the CPU both sentences take one length, so the shared layers run once over both.
        premise_ids, premise_mask, hypothesis_ids, hypothesis_mask = same_length(*premise, *hypothesis)
        premise, hypothesis = Sentences(premise_ids, premise_mask), Sentences(hypothesis_ids, hypothesis_mask)
        batch = premise.ids.shape[0]
        if self.nonover_blocks is not None:
            # Both copies of the network read one batch of 2B pairs, ORIG's B then NONOVER's.
            premise, hypothesis = (_with_copy(premise, nonoverlapping(premise, hypothesis)),
                                   _with_copy(hypothesis, nonoverlapping(hypothesis, premise)))
        features, weights = self._scores(premise, hypothesis, batch)
        logits = F.linear(features, self.output.weight[:, : features.shape[-1]], self.output.bias)
        return logits, self._at_lengths(weights, lengths["hypothesis"], lengths["premise"])

    def _at_lengths(self, weights: dict[str, torch.Tensor], hypothesis_length: int, premise_length: int
                    ) -> dict[str, torch.Tensor]:
        """The maps cut back to the sentences' own lengths (``same_length`` may have padded them):
        "blockI_input" over words, "blockI_conv" over a wide convolution's n + w - 1 columns."""
        extra = {"input": 0, "conv": self.blocks[0].width - 1}
        return {name: weight[:, : hypothesis_length + extra[name.rsplit("_", 1)[1]],
                             : premise_length + extra[name.rsplit("_", 1)[1]]]
                for name, weight in weights.items()}

    def _copies_of_block(self, index: int) -> list[_Block]:
        """Block ``index`` of each copy of the network: ORIG's, then NONOVER's."""
        return [stack[index] for stack in (self.blocks, self.nonover_blocks) if stack is not None]

    def _scores(self, premise: Sentences, hypothesis: Sentences, batch: int):
        """The LR layer's features [B, copies x 2 x (active blocks + 1)] and ORIG's attention
        maps by name; each sentence holds every copy's ``batch`` rows in turn."""
        (x0, mean0), (x1, mean1) = on_both_sentences(self._embed, premise, hypothesis)
        scores = [_similarity_scores(mean0, mean1)]
        weights = {}
        for i in range(self.active_blocks):
            block = _BlockCopies(self._copies_of_block(i), batch)
            (x0, x1), summary, attention = block(x0, premise.mask, x1, hypothesis.mask)
            scores.append(_similarity_scores(*summary))
            weights.update({f"block{i + 1}_{k}": a[:batch].transpose(1, 2) for k, a in attention.items()})
        # Block by block, each copy's scores in turn (ORIG, NONOVER): layerwise phase k reads a prefix.
        by_pair = torch.cat([s.view(-1, batch, _SCORES_PER_BLOCK).transpose(0, 1) for s in scores], dim=1)
        return by_pair.view(batch, -1), weights

    def _embed(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The input block b_1: word vectors (zero at padding) and their all-ap."""
        x = self.dropout(self.word_embeddings(ids)) * mask.unsqueeze(-1)
        return x, masked_mean(x, mask)

    @classmethod
    def check_longest_sentence(cls, args: ABCNNArguments, tokens: int) -> None:
        """ABCNN-1/3 take sentences of at most max_length tokens (see ``check_lengths``)."""
        if args.variant in ATTENTION_INPUT_VARIANTS and tokens > args.max_length:
            raise ValueError(
                f"model.args.max_length={args.max_length}, but the corpus has a sentence of {tokens} tokens "
                f"and {args.variant}'s attention on the input (W_0, max_length columns) takes none longer "
                f"than max_length: set model.args.max_length: {tokens} or more")

    def check_lengths(self, premise_mask: torch.Tensor, hypothesis_mask: torch.Tensor) -> None:
        """With attention on the input (ABCNN-1/3: W_0 has max_length columns), no sentence may be
        longer than max_length (see ``PairClassifier.check_lengths``)."""
        if not self.attention_input:
            return
        for mask in (premise_mask, hypothesis_mask):
            if mask.shape[-1] <= self.max_length:
                continue
            beyond = mask[..., self.max_length :].any()
            if not layers.on_host(mask):
                # Checked on the device, without waiting for it (a host read would stall every step).
                torch._assert_async(~beyond, f"a sentence is longer than max_length={self.max_length}")
            elif bool(beyond):
                raise ValueError(f"a sentence has {int(mask.sum(dim=-1).max())} tokens but the model "
                                 f"was built with max_length={self.max_length}")

    def _fit(self, sentences: Sentences) -> Sentences:
        """Drop padding columns beyond max_length (W_0 has max_length columns; ``check_lengths``
        refused longer sentences)."""
        ids, mask = sentences
        return Sentences(ids[:, : self.max_length], mask[:, : self.max_length])
