"""Analytic FLOP counts of one training step per model (matmul FLOPs only).

Counted: the multiply-adds (2 FLOPs each) of every matrix product the forward pass makes — LSTM
gates (input and recurrent matmuls of the four gates), linear/feed-forward layers, attention
score and weighted-sum batched matmuls, convolutions. Not counted: element-wise operations
(tanh, sigmoid, softmax, masking, norms, pooling), embedding lookups and the optimizer update.
Training = forward × 3 (the backward pass costs about twice the forward: gradients with respect
to both inputs and weights of every matmul).

Lengths, as the CPU computes them: word-vector projections run once per distinct word of the
batch (``layers.distinct_words``); decomposable attention's F, G and F_intra run on real words
and NULL only (``layers.RealPositions``); Rocktäschel's LSTMs run over the padded rows (the
premise's with its padding steps held, ``layers.run_lstm``) and CAM's BiLSTM packed, per real
token; every other layer runs on the padded [B, L] tensors and costs per padded position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRAINING_FACTOR = 3  # forward + backward (≈ 2 × forward)


@dataclass(frozen=True)
class BatchShape:
    batch: int  # B
    premise_padded: int  # Lp
    hypothesis_padded: int  # Lh
    premise_tokens: int  # real premise tokens in the batch (sum of lengths)
    hypothesis_tokens: int
    distinct_words: int  # distinct word ids over both sentences, padding included


def linear(rows: int, d_in: int, d_out: int) -> int:
    """[rows, d_in] @ [d_in, d_out]."""
    return 2 * rows * d_in * d_out


def lstm(tokens: int, d_in: int, hidden: int, directions: int = 1) -> int:
    """Per token and direction: the 4 gates' input (d_in -> 4k) and recurrent (k -> 4k) matmuls."""
    return directions * 2 * tokens * 4 * hidden * (d_in + hidden)


def feed_forward(rows: int, d_in: int, hidden: int) -> int:
    """Two layers d_in -> hidden -> hidden (Parikh's F, G, H)."""
    return linear(rows, d_in, hidden) + linear(rows, hidden, hidden)


# --- Rocktäschel et al. (2016) ----------------------------------------------------------------


def _rocktaschel_read(c: dict[str, Any], s: BatchShape, lp: int, lh: int) -> int:
    e, k, b = c["embedding_dim"], c["hidden_size"], s.batch
    flops = linear(s.distinct_words, e, k)  # word-vector projection, once per distinct word
    flops += lstm(b * lp, k, k) + lstm(b * lh, k, k)  # premise, hypothesis LSTM (padded rows)
    variant = c.get("variant", "word_by_word")
    if variant == "conditional":
        return flops
    flops += linear(b * lp, k, k)  # W^y Y
    if variant == "attention":
        flops += linear(b, k, k)  # W^h h_N
        flops += linear(b * lp, k, 1) + 2 * b * lp * k  # w^T M, r = Y α
    else:  # word_by_word: W^h h_t for every t once, then per hypothesis step t
        flops += linear(b * lh, k, k)
        per_step = linear(b, k, k) + linear(b * lp, k, 1) + 2 * b * lp * k + linear(b, k, k)
        flops += lh * per_step  # W^r r_{t-1}, w^T M_t, Y α_t, W^t r_{t-1}
    flops += 2 * linear(b, k, k)  # W^p r, W^x h_N
    return flops


def rocktaschel(c: dict[str, Any], s: BatchShape) -> int:
    k, b, classes = c["hidden_size"], s.batch, c["num_classes"]
    lp, lh = s.premise_padded, s.hypothesis_padded
    flops = _rocktaschel_read(c, s, lp, lh)
    if c.get("two_way"):  # the same weights once more with the sentences swapped (the
        # projection is shared, but counted again: it is small)
        flops += _rocktaschel_read(c, s, lh, lp)
    return flops + linear(b, k * (2 if c.get("two_way") else 1), classes)


# --- Parikh et al. (2016) ---------------------------------------------------------------------


def decomposable(c: dict[str, Any], s: BatchShape) -> int:
    e, p, h, b = c["embedding_dim"], c["projection_dim"], c["hidden_size"], s.batch
    la, lb = s.premise_padded + 1, s.hypothesis_padded + 1  # NULL prepended
    words = s.premise_tokens + s.hypothesis_tokens + 2 * b  # real words and the NULLs
    flops = linear(s.distinct_words + 1, e, p)  # projection, once per distinct word and NULL
    d = p
    if c.get("variant") == "intra":
        flops += feed_forward(words, p, h)  # F_intra
        for length in (la, lb):  # f_ij = F(a_i)·F(a_j), a'_i = Σ_j w_ij a_j
            flops += 2 * b * length * length * h + 2 * b * length * length * p
        d = 2 * p
    flops += feed_forward(words, d, h)  # attend F
    flops += 2 * b * la * lb * h  # e_ij
    flops += 2 * (2 * b * la * lb * d)  # β = softmax(e) b, α = softmax(e)^T a
    flops += feed_forward(words, 2 * d, h)  # compare G
    flops += feed_forward(b, 2 * h, h) + linear(b, h, c["num_classes"])  # aggregate H, output
    return flops


# --- Gajbhiye et al. (2018), CAM ----------------------------------------------------------------


def cam(c: dict[str, Any], s: BatchShape) -> int:
    e, k, b = c["embedding_dim"], c["hidden_size"], s.batch
    lp, lh, w = s.premise_padded, s.hypothesis_padded, 2 * c["hidden_size"]
    flops = lstm(s.premise_tokens + s.hypothesis_tokens, e, k, directions=2)  # shared BiLSTM
    variant = c.get("variant", "full")
    if variant != "inter_only":  # additive intra-attention over each sentence
        for length in (lp, lh):
            flops += linear(b * length, w, w) + linear(b, w, w)  # W^y Y, W^h R_avg
            flops += linear(b * length, w, 1) + 2 * b * length * w  # w^T M, Y α
    if variant != "intra_only":  # e = r_p r_h^T, two attention-weighted sums
        flops += 3 * (2 * b * lp * lh * w)
    flops += linear(b, 4 * w, k) + linear(b, k, c["num_classes"])  # MLP
    return flops


# --- Yin et al. (2016), ABCNN -----------------------------------------------------------------


def abcnn(c: dict[str, Any], s: BatchShape) -> int:
    e, d, width, b = c["embedding_dim"], c["hidden_size"], c["filter_width"], s.batch
    variant = c.get("variant", "abcnn3")
    attention_input = variant in ("abcnn1", "abcnn3")
    attention_pooling = variant in ("abcnn2", "abcnn3")
    max_length = c.get("max_length", 40)
    l0, l1 = s.premise_padded, s.hypothesis_padded
    if attention_input:
        l0, l1 = min(l0, max_length), min(l1, max_length)
    flops, d_in = 0, e
    for _ in range(c.get("num_blocks", 1)):
        channels = d_in
        if attention_input:  # match scores x0·x1 (eq. 2), W A and W A^T (eq. 3-4)
            flops += 2 * b * l0 * l1 * d_in + 2 * (2 * b * l0 * l1 * d_in)
            channels = 2 * d_in
        for length in (l0, l1):  # wide convolution: L + w - 1 columns of (channels·w) -> d
            flops += 2 * b * (length + width - 1) * channels * width * d
        if attention_pooling:  # match scores over convolution columns
            flops += 2 * b * (l0 + width - 1) * (l1 + width - 1) * d
        d_in = d
    return flops + linear(b, 2 * (c.get("num_blocks", 1) + 1), c["num_classes"])


FORWARD = {"rocktaschel": rocktaschel, "decomposable": decomposable, "cam": cam, "abcnn": abcnn}


def training_flops(model: str, config: dict[str, Any], shape: BatchShape) -> int:
    """Matmul FLOPs of one forward + backward pass (the optimizer step is not counted)."""
    return TRAINING_FACTOR * FORWARD[model](config, shape)
