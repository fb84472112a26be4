"""Rocktäschel et al. (2016), "Reasoning about Entailment with Neural Attention".

One LSTM reads the premise; a second one (or the same one, ``shared_encoder``) reads a delimiter
and the hypothesis starting from the premise's last cell state (§2.2.1). The variants differ in
what the classifier sees:

- conditional: the last hypothesis output h_N, non-linearly projected into the class space;
- attention: h* = tanh(W^p r + W^x h_N), r attending over the premise outputs once (eq. 7-10);
- word_by_word: r_t re-attends over the premise at every hypothesis word (eq. 11-14).

``two_way`` (§2.5) runs the same weights a second time with the sentences swapped and
concatenates both h*. Dropout sits on the LSTM inputs and before the output layer only
(footnote 3: "only on the inputs and outputs of the network").

Parameter counts: Table 1's |θ|M includes the word-vector projection (a linear layer with bias)
and two bias vectors per LSTM gate (as in cuDNN/PyTorch LSTMs): with one bias vector per gate
the k=159, k=116 and word-by-word rows would round to 251k, not the printed 252k. The delimiter
is a vocabulary word (``delimiter_id``; None reads no delimiter), so its vector lies in the
embedding table and counts in |θ|W, not |θ|M: a learned delimiter inside the model would push
the k=116 row to 253k. The attention rows do not reach 242k; see their PaperConfig notes.

The second LSTM starts from (h = 0, c = the premise's last cell state): §2.2.1 conditions it on
the cell state only.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import model_validator
from torch import nn

from nli_models.embeddings import PAD_INDEX, WordEmbeddings
from nli_models.models.arguments import ModelArguments, Rate, Size, one_of, variant_of
from nli_models.models.layers import (
    AdditiveAttention,
    Dropout,
    padding_bias,
    per_word,
    run_lstm,
    run_lstm_outputs,
)
from nli_models.models.pair_classifier import PairClassifier, Sentences
from nli_models.models.word_by_word import WordByWordAttention
from nli_models.registry import PaperConfig, register_model

_PAPER = "rocktaschel2016"
_SNLI = {"embedding_dim": 300, "num_classes": 3}
_ATTENTION_NOTE = (
    "Eq. 7-10 have W^y, W^h, W^p, W^x (4 k x k) + w; with two LSTMs, the projection and the "
    "softmax layer that gives {ours} parameters, {gap:+.1%} against the published 242k. The "
    "published count fits one more k x k matrix (word-by-word attention, with W^r and W^t, is "
    "252k and matches); the paper names no such matrix for this model, so it is not added."
)


class RocktaschelArguments(ModelArguments):
    variant: variant_of("conditional", "attention", "word_by_word") = "word_by_word"
    hidden_size: Size = 100
    dropout: Rate = 0.0
    shared_encoder: one_of(False, True) = False
    two_way: one_of(False, True) = False
    delimiter_id: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RocktaschelArguments:
        if self.two_way and self.variant == "conditional":
            raise ValueError(
                "two_way=True needs an attention variant ('attention' or 'word_by_word'); "
                "variant 'conditional' has nothing to attend with"
            )
        if self.delimiter_id is not None and not PAD_INDEX < self.delimiter_id < self.vocab_size:
            raise ValueError(
                f"delimiter_id must be None or a token id in [1, {self.vocab_size}); "
                f"got {self.delimiter_id!r}"
            )
        return self


def _config(
    table_row: str, published: int, notes: str = "", expected: int | None = None, **config
) -> PaperConfig:
    """``expected`` pins our |θ|M where it deviates from ``published`` for the reason in notes."""
    return PaperConfig(
        model="rocktaschel",
        config={**_SNLI, **config},
        paper=_PAPER,
        table_row=table_row,
        published_theta_m=published,
        notes=notes,
        extra={} if expected is None else {"expected_theta_m": expected},
    )


@register_model("rocktaschel")
class Rocktaschel2016(PairClassifier):
    Arguments = RocktaschelArguments
    PAPER_CONFIGS = (
        _config(
            "Table 1: Conditional encoding, shared (k=100)",
            111_000,
            variant="conditional",
            hidden_size=100,
            shared_encoder=True,
        ),
        _config(
            "Table 1: Conditional encoding, shared (k=159)",
            252_000,
            variant="conditional",
            hidden_size=159,
            shared_encoder=True,
        ),
        _config(
            "Table 1: Conditional encoding (k=116)",
            252_000,
            variant="conditional",
            hidden_size=116,
        ),
        _config(
            "Table 1: Attention (k=100)",
            242_000,
            _ATTENTION_NOTE.format(ours=232_103, gap=232_103 / 242_000 - 1),
            variant="attention",
            hidden_size=100,
            expected=232_103,
        ),
        _config(
            "Table 1: Attention, two-way (k=100)",
            242_000,
            _ATTENTION_NOTE.format(ours=232_403, gap=232_403 / 242_000 - 1)
            + " Two-way adds only the wider softmax layer (2k inputs).",
            variant="attention",
            hidden_size=100,
            two_way=True,
            expected=232_403,
        ),
        _config(
            "Table 1: Word-by-word attention (k=100)",
            252_000,
            variant="word_by_word",
            hidden_size=100,
        ),
        _config(
            "Table 1: Word-by-word attention, two-way (k=100)",
            252_000,
            variant="word_by_word",
            hidden_size=100,
            two_way=True,
        ),
    )

    def __init__(self, **arguments: Any):
        """``arguments``: the fields of RocktaschelArguments, validated here."""
        super().__init__()
        args = self.Arguments.parse(arguments, self.registered_name)
        variant, hidden_size, num_classes = args.variant, args.hidden_size, args.num_classes
        self.variant = variant
        self.two_way = args.two_way
        self.delimiter_id = args.delimiter_id

        self.word_embeddings = WordEmbeddings(args.vocab_size, args.embedding_dim)
        # §2.2.1: "a linear layer to project word vectors to the dimensionality of the hidden size".
        self.projection = nn.Linear(args.embedding_dim, hidden_size)
        self.dropout = Dropout(args.dropout)
        self.premise_lstm = nn.LSTM(hidden_size, hidden_size, batch_first=True)
        self.hypothesis_lstm = (
            self.premise_lstm
            if args.shared_encoder
            else nn.LSTM(hidden_size, hidden_size, batch_first=True)
        )
        if variant == "conditional":
            # §2.2.1: a non-linear projection of h_N straight into the class space; the softmax
            # is in the loss. (A k x k layer in between would make the k=100 row 121k, not 111k.)
            self.output = nn.Linear(hidden_size, num_classes)
            return
        self.attention = AdditiveAttention(hidden_size)  # W^y, W^h, w
        if variant == "word_by_word":
            self.w_r = nn.Linear(hidden_size, hidden_size, bias=False)  # eq. 11
            self.w_t = nn.Linear(hidden_size, hidden_size, bias=False)  # eq. 13
            self.word_by_word_attention = WordByWordAttention()  # eq. 11-13's recurrence
        self.w_p = nn.Linear(hidden_size, hidden_size, bias=False)  # eq. 10/14
        self.w_x = nn.Linear(hidden_size, hidden_size, bias=False)
        self.output = nn.Linear(hidden_size * (2 if args.two_way else 1), num_classes)

    def classify(self, premise: Sentences, hypothesis: Sentences):
        """Attention: "hypothesis_to_premise" [B, Lh, Lp] (word_by_word) or [B, 1, Lp]
        (attention); two_way adds "premise_to_hypothesis" [B, Lp, Lh] or [B, 1, Lh];
        conditional has none."""
        premise, hypothesis, delimiter = self._project(premise, hypothesis)
        pair, attention = self._read(premise, hypothesis, delimiter)
        if self.variant == "conditional":
            return torch.tanh(self.output(self.dropout(pair))), {}
        weights = {"hypothesis_to_premise": attention}
        if self.two_way:
            swapped, weights["premise_to_hypothesis"] = self._read(hypothesis, premise, delimiter)
            pair = torch.cat([pair, swapped], dim=-1)
        return self.output(self.dropout(pair)), weights

    def _project(
        self, premise: Sentences, hypothesis: Sentences
    ) -> tuple[Sentences, Sentences, torch.Tensor | None]:
        """Both sentences' word vectors and the delimiter's [1, 1, k] (None without one),
        projected to k (§2.2.1), on CPU once per distinct word of the batch (``per_word``)."""
        ids = [premise.ids, hypothesis.ids]
        if self.delimiter_id is not None:
            ids.append(premise.ids.new_full((1, 1), self.delimiter_id))
        vectors = per_word(lambda words: self.projection(self.word_embeddings(words)), *ids)
        delimiter = vectors[2] if self.delimiter_id is not None else None
        return Sentences(vectors[0], premise.mask), Sentences(vectors[1], hypothesis.mask), delimiter

    def _read(
        self, premise: Sentences, hypothesis: Sentences, delimiter: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Read the premise, then the hypothesis conditioned on it -> (h_N or h*, attention).
        The sentences hold projected word vectors [B, L, k]; dropout is drawn here, per read."""
        (premise, premise_mask), (hypothesis, hypothesis_mask) = premise, hypothesis
        # One zero state: the premise LSTM's (h_0, c_0) and the hypothesis LSTM's h_0.
        zeros = premise.new_zeros(1, premise.shape[0], self.premise_lstm.hidden_size)
        outputs_premise, (_, c_premise) = run_lstm(
            self.premise_lstm, self.dropout(premise), premise_mask, (zeros, zeros), final_h=False
        )
        read, read_mask = hypothesis, hypothesis_mask
        if delimiter is not None:
            read = torch.cat([delimiter.expand(read.shape[0], 1, -1), read], dim=1)
            read_mask = torch.cat([torch.ones_like(hypothesis_mask[:, :1]), hypothesis_mask], 1)
        # §2.2.1: the second LSTM's memory (cell) state starts as the premise's last cell state.
        state = (zeros, c_premise)
        # Only the outputs and h_N are needed here, not the last cell state: one LSTM call.
        outputs, h_n = run_lstm_outputs(
            self.hypothesis_lstm, self.dropout(read), read_mask, state
        )
        if self.variant == "conditional":
            return h_n, None
        if self.variant == "attention":
            r, alpha = self.attention(  # eq. 7-9
                outputs_premise, padding_bias(premise_mask, outputs_premise.dtype), h_n)
            alpha = alpha.unsqueeze(1)
        else:
            # Attention runs over the hypothesis words only, not the delimiter (t in (L+1, N)).
            word_outputs = outputs[:, outputs.shape[1] - hypothesis.shape[1] :]
            r, alpha = self._word_by_word(
                outputs_premise, premise_mask, word_outputs, hypothesis_mask
            )
        # Eq. 10 / 14, h* = tanh(W^p r + W^x h_N), the sum fused into one addmm.
        return torch.tanh(torch.addmm(self.w_x(h_n), r, self.w_p.weight.t())), alpha

    def _word_by_word(
        self,
        premise_outputs: torch.Tensor,
        premise_mask: torch.Tensor,
        hypothesis_outputs: torch.Tensor,
        hypothesis_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 11-13 -> (r_N, α [B, Lh, Lp])."""
        return self.word_by_word_attention(
            premise_outputs,
            premise_mask,
            hypothesis_outputs,
            hypothesis_mask,
            self.attention.w_y.weight,
            self.attention.w_h.weight,
            self.w_r.weight,
            self.w_t.weight,
            self.attention.w.weight,
        )
