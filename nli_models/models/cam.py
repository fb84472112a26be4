"""Gajbhiye et al. (2018), "CAM: A Combined Attention Model for Natural Language Inference".

A BiLSTM (shared by both sentences, eq. 1-2) encodes each sentence; intra-attention (the inner
attention of Liu et al., eq. 3-5) weights each sentence against its own average; dot-product
inter-attention (eq. 6-8) aligns the two; f = r~ ⊙ r (eq. 9-10) is average- and max-pooled
(eq. 11-12) and the four vectors (eq. 13) go to an MLP with one tanh hidden layer.
``intra_only`` skips eq. 6-10 (the intra representations are pooled directly), ``inter_only``
skips eq. 3-5 (inter-attention runs on the BiLSTM outputs).

``intra_output`` settles an ambiguity of §III; docs/fidelity.md gives the reasoning.
- "scale" (the default) is a RECONSTRUCTION, not the paper's words: one vector per word,
  r_i = α_i ȳ_i (each BiLSTM output weighted by its intra-attention weight), so eq. 6-10 align
  words as their indices i, j and the sums over 1..n / 1..m say they should.
- "repeat" is the LITERAL reading: eq. 5 gives one vector r per sentence, "repeated for the
  maximum sentence length" to form r_p and r_h. Then every e_ij of eq. 6 is the same number,
  inter-attention is uniform (each row 1/m), and the full model's classifier sees only
  r_p ⊙ r_h: less than intra_only sees, which cannot give Table IV's full > intra-only
  (+5.9 points on SNLI).

Dropout (§IV), where ``dropout_at`` says:
- "bilstm_input" (the SNLI setup: 0.4 "only to the input of BiLSTM layer");
- "feed_forward" (the SciTail setup: 0.3 "to each feed forward connection"), read as the two
  connections of the MLP classifier (its input and its hidden layer), not the BiLSTM input.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import model_validator
from torch import nn

from nli_models.embeddings import WordEmbeddings
from nli_models.models.arguments import ModelArguments, Rate, Size, one_of, variant_of
from nli_models.models.layers import (
    AdditiveAttention,
    Dropout,
    SentencePair,
    attention_at_lengths,
    padding_bias,
    run_lstm,
    same_length,
)
from nli_models.models.pair_classifier import PairClassifier, Sentences
from nli_models.registry import PaperConfig, register_model


class CAMArguments(ModelArguments):
    variant: variant_of("full", "intra_only", "inter_only") = "full"
    hidden_size: Size = 300
    dropout: Rate = 0.0
    dropout_at: one_of("bilstm_input", "feed_forward") = "bilstm_input"
    intra_output: one_of(None, "scale", "repeat") = None  # "scale" where there is intra-attention

    @model_validator(mode="after")
    def _intra_output_needs_intra_attention(self) -> CAMArguments:
        if self.variant == "inter_only":
            if self.intra_output is not None:
                raise ValueError(
                    "intra_output only applies to variants with intra-attention ('full', "
                    f"'intra_only'); variant 'inter_only' got intra_output={self.intra_output!r}"
                )
        elif self.intra_output is None:
            self.intra_output = "scale"
        return self


def _paper_config(variant: str, table_row: str, corpus: str) -> PaperConfig:
    # §IV: hidden states 300 (SNLI) / 100 (SciTail); dropout 0.4 on the BiLSTM input (SNLI),
    # 0.3 on feed-forward connections (SciTail). SciTail has two classes.
    snli = corpus == "SNLI"
    return PaperConfig(
        model="cam",
        config={
            "embedding_dim": 300,
            "num_classes": 3 if snli else 2,
            "variant": variant,
            "hidden_size": 300 if snli else 100,
            "dropout": 0.4 if snli else 0.3,
            "dropout_at": "bilstm_input" if snli else "feed_forward",
        },
        paper="gajbhiye2018",
        table_row=f"{table_row} ({corpus})",
        published_theta_m=None,
        notes="Gajbhiye et al. publish no parameter counts.",
    )


@register_model("cam")
class CombinedAttentionModel(PairClassifier):
    Arguments = CAMArguments
    PAPER_CONFIGS = tuple(
        _paper_config(variant, row, corpus)
        for corpus in ("SNLI", "SciTail")
        for variant, row in (
            ("full", "Table IV: Combined Attention"),
            ("intra_only", "Table IV: Intra-attention-only"),
            ("inter_only", "Table IV: Inter-attention-only"),
        )
    )

    def __init__(self, **arguments: Any):
        """``arguments``: the fields of CAMArguments, validated here."""
        super().__init__()
        args = self.Arguments.parse(arguments, self.registered_name)
        hidden_size, variant = args.hidden_size, args.variant
        self.variant = variant
        self.intra_output = args.intra_output
        self.word_embeddings = WordEmbeddings(args.vocab_size, args.embedding_dim)
        input_rate, feed_forward_rate = (
            (args.dropout, 0.0) if args.dropout_at == "bilstm_input" else (0.0, args.dropout)
        )
        self.dropout = Dropout(input_rate)
        self.encoder = nn.LSTM(
            args.embedding_dim, hidden_size, batch_first=True, bidirectional=True
        )
        width = 2 * hidden_size  # ā_i, b̄_j are 2d-dimensional
        self.intra_attention = AdditiveAttention(width) if variant != "inter_only" else None
        self.classifier = nn.Sequential(
            Dropout(feed_forward_rate),
            nn.Linear(4 * width, hidden_size),  # eq. 13: [v_p,avg; v_p,max; v_h,avg; v_h,max]
            nn.Tanh(),
            Dropout(feed_forward_rate),
            nn.Linear(hidden_size, args.num_classes),
        )

    def classify(self, premise: Sentences, hypothesis: Sentences):
        """Attention: "premise_intra" [B, 1, Lp], "hypothesis_intra" [B, 1, Lh] (eq. 4) and
        "hypothesis_to_premise" [B, Lh, Lp], "premise_to_hypothesis" [B, Lp, Lh] (eq. 7-8)."""
        lengths = premise.ids.shape[1], hypothesis.ids.shape[1]
        premise_ids, premise_mask, hypothesis_ids, hypothesis_mask = same_length(
            premise.ids, premise.mask, hypothesis.ids, hypothesis.mask)
        # Every layer but inter-attention is shared by both sentences: off the CPU it runs once
        # over both (SentencePair); inter-attention runs once too, each sentence against its partner.
        ids, mask = SentencePair.of(premise_ids, hypothesis_ids), SentencePair.of(premise_mask, hypothesis_mask)
        r, means, padding, *alpha = ids.map(self._encode_and_attend, mask)
        weights = {}
        if self.intra_attention is not None:
            weights["premise_intra"], weights["hypothesis_intra"] = alpha[0].halves()  # [B, L]
        f = r
        if self.variant != "intra_only":
            f, to_partner = r.map(_aligned, r.swapped(), padding.swapped())  # eq. 6-10
            weights["premise_to_hypothesis"], weights["hypothesis_to_premise"] = to_partner.halves()
        average, maximum = f.map(_pooled, means, padding)  # eq. 11-12
        (average_p, average_h), (maximum_p, maximum_h) = average.halves(), maximum.halves()
        relation = torch.cat([average_p, maximum_p, average_h, maximum_h], dim=-1)  # eq. 13
        weights = attention_at_lengths(weights, {"premise": lengths[0], "hypothesis": lengths[1]})
        for name in ("premise_intra", "hypothesis_intra"):
            if name in weights:
                weights[name] = weights[name].unsqueeze(1)
        return self.classifier(relation), weights

    def _encode_and_attend(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Eq. 1-2 (the BiLSTM), then eq. 3-5 where there is intra-attention -> (r [B, L, 2d],
        the masked-average weights [B, 1, L] and the padding bias [B, 1, L] that every later
        average and attention over the sentence reuses) and α [B, L] with intra-attention."""
        embedded = self.dropout(self.word_embeddings(ids))
        outputs, _ = run_lstm(self.encoder, embedded, mask, final_h=False)
        # The masks' terms, once per batch: a masked mean is the product with 1/n at real tokens.
        real = mask.unsqueeze(1).to(outputs.dtype)
        means = real / real.sum(dim=-1, keepdim=True).clamp(min=1)
        padding = padding_bias(mask.unsqueeze(1), outputs.dtype)
        if self.intra_attention is None:
            return outputs, means, padding
        sequence, alpha = self._intra(outputs, means, padding)
        return sequence, means, padding, alpha

    def _intra(self, y: torch.Tensor, means: torch.Tensor, padding: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 3-5 with R_avg the masked average of Y -> (r_p or r_h [B, L, 2d], α [B, L])."""
        r, alpha = self.intra_attention(y, padding, torch.bmm(means, y).squeeze(1))
        if self.intra_output == "repeat":  # the literal reading: uniform inter-attention
            sequence = r.unsqueeze(1).expand_as(y)
        else:  # "scale", the reconstruction: r_i = α_i ȳ_i, one vector per word
            sequence = alpha.unsqueeze(-1) * y
        return sequence, alpha


def _aligned(r: torch.Tensor, partner: torch.Tensor, partner_padding: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6-10 for one sentence against its partner: e_ij = r_i · r~_j, its softmax over the
    partner's words, and f = (the aligned partner) ⊙ r -> (f [B, L, 2d], weights [B, L, L']).
    For the hypothesis, e is eq. 6's e transposed, taken by its own product (the same sums): each
    side is then one op, and off the CPU both sides are one op over the pair."""
    weights = torch.softmax(torch.bmm(r, partner.transpose(1, 2)) + partner_padding, dim=-1)
    return torch.bmm(weights, partner) * r, weights


def _pooled(f: torch.Tensor, means: torch.Tensor, padding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 11-12: the average and the max over a sentence's words -> ([B, 2d], [B, 2d])."""
    return torch.bmm(means, f).squeeze(1), (f + padding.transpose(1, 2)).amax(dim=1)
