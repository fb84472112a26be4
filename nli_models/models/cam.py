"""Gajbhiye et al. (2018), "CAM: A Combined Attention Model for Natural Language Inference".

A BiLSTM (shared by both sentences, eq. 1-2) encodes each sentence; intra-attention (the inner
attention of Liu et al., eq. 3-5) weights each sentence against its own average; dot-product
inter-attention (eq. 6-8) aligns the two; f = r~ ⊙ r (eq. 9-10) is average- and max-pooled
(eq. 11-12) and the four vectors (eq. 13) go to an MLP with one tanh hidden layer.
``intra_only`` skips eq. 6-10 (the intra representations are pooled directly), ``inter_only``
skips eq. 3-5 (inter-attention runs on the BiLSTM outputs).

``intra_output`` settles an ambiguity of §III. Eq. 5 gives one vector r per sentence, and the
text says r "is repeated for the maximum sentence length" to form r_p and r_h ("repeat", the
default, literal reading). Then every e_ij of eq. 6 is the same number, inter-attention is
uniform and the full model only sees r_p ⊙ r_h, which is hard to square with the +5.9 points of the full
model over intra_only on SNLI (Table IV). "scale" keeps one vector per word, r_i = α_i ȳ_i (each
BiLSTM output weighted by its intra-attention weight), so eq. 6-10 align words again.

Dropout: on the BiLSTM input (the SNLI setup) and on the MLP's inputs (the SciTail setup's
"each feed forward connection").
"""

from __future__ import annotations

import torch
from torch import nn

from nli_models.embeddings import WordEmbeddings
from nli_models.models.layers import (
    AdditiveAttention,
    Dropout,
    check_choice,
    check_dropout,
    check_positive,
    masked_max,
    masked_mean,
    masked_softmax,
    run_lstm,
)
from nli_models.registry import PaperConfig, register_model

INTRA_OUTPUTS = ("repeat", "scale")


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
        },
        paper="gajbhiye2018",
        table_row=f"{table_row} ({corpus})",
        published_theta_m=None,
        notes="Gajbhiye et al. publish no parameter counts.",
    )


@register_model("cam")
class CombinedAttentionModel(nn.Module):
    VARIANTS = ("full", "intra_only", "inter_only")
    PAPER_CONFIGS = tuple(
        _paper_config(variant, row, corpus)
        for corpus in ("SNLI", "SciTail")
        for variant, row in (
            ("full", "Table IV: Combined Attention"),
            ("intra_only", "Table IV: Intra-attention-only"),
            ("inter_only", "Table IV: Inter-attention-only"),
        )
    )

    def __init__(
        self,
        *,
        vocab_size: int,
        embedding_dim: int,
        num_classes: int,
        variant: str = "full",
        hidden_size: int = 300,
        dropout: float = 0.0,
        intra_output: str = "repeat",
    ):
        super().__init__()
        check_choice("variant", variant, self.VARIANTS)
        check_positive("num_classes", num_classes)
        check_positive("hidden_size", hidden_size)
        check_dropout(dropout)
        check_choice("intra_output", intra_output, INTRA_OUTPUTS)
        if variant == "inter_only" and intra_output != "repeat":
            raise ValueError(
                "intra_output only applies to variants with intra-attention ('full', "
                f"'intra_only'); variant 'inter_only' got intra_output={intra_output!r}"
            )
        self.variant = variant
        self.intra_output = intra_output
        self.word_embeddings = WordEmbeddings(vocab_size, embedding_dim)
        self.dropout = Dropout(dropout)
        self.encoder = nn.LSTM(embedding_dim, hidden_size, batch_first=True, bidirectional=True)
        width = 2 * hidden_size  # ā_i, b̄_j are 2d-dimensional
        self.intra_attention = AdditiveAttention(width) if variant != "inter_only" else None
        self.classifier = nn.Sequential(
            Dropout(dropout),
            nn.Linear(4 * width, hidden_size),  # eq. 13: [v_p,avg; v_p,max; v_h,avg; v_h,max]
            nn.Tanh(),
            Dropout(dropout),
            nn.Linear(hidden_size, num_classes),
        )

    def forward(
        self,
        premise: torch.Tensor,
        premise_mask: torch.Tensor,
        hypothesis: torch.Tensor,
        hypothesis_mask: torch.Tensor,
        return_attention: bool = False,
    ):
        """Attention: "premise_intra" [B, 1, Lp], "hypothesis_intra" [B, 1, Lh] (eq. 4) and
        "hypothesis_to_premise" [B, Lh, Lp], "premise_to_hypothesis" [B, Lp, Lh] (eq. 7-8)."""
        r_p, r_h = self._encode(premise, premise_mask), self._encode(hypothesis, hypothesis_mask)
        weights = {}
        if self.intra_attention is not None:
            r_p, weights["premise_intra"] = self._intra(r_p, premise_mask)
            r_h, weights["hypothesis_intra"] = self._intra(r_h, hypothesis_mask)
        f_p, f_h = r_p, r_h
        if self.variant != "intra_only":
            e = torch.bmm(r_p, r_h.transpose(1, 2))  # eq. 6, [B, Lp, Lh]
            to_h = masked_softmax(e, hypothesis_mask.unsqueeze(1))
            to_p = masked_softmax(e.transpose(1, 2), premise_mask.unsqueeze(1))
            f_p = torch.bmm(to_h, r_h) * r_p  # eq. 7, 9
            f_h = torch.bmm(to_p, r_p) * r_h  # eq. 8, 10
            weights.update(premise_to_hypothesis=to_h, hypothesis_to_premise=to_p)
        relation = torch.cat(  # eq. 11-13
            [
                masked_mean(f_p, premise_mask),
                masked_max(f_p, premise_mask),
                masked_mean(f_h, hypothesis_mask),
                masked_max(f_h, hypothesis_mask),
            ],
            dim=-1,
        )
        logits = self.classifier(relation)
        return (logits, weights) if return_attention else logits

    def _encode(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        outputs, _ = run_lstm(self.encoder, self.dropout(self.word_embeddings(ids)), mask)
        return outputs  # eq. 1-2

    def _intra(self, y: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 3-5 with R_avg the masked average of Y -> (r_p or r_h [B, L, 2d], α [B, 1, L])."""
        r, alpha = self.intra_attention(y, mask, masked_mean(y, mask))
        if self.intra_output == "repeat":
            sequence = r.unsqueeze(1).expand_as(y)
        else:
            sequence = alpha.unsqueeze(-1) * y
        return sequence, alpha.unsqueeze(1)
