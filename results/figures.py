"""Figures as files for a paper: every figure is written as PNG (to look at), PDF and SVG."""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FORMATS = ("png", "pdf", "svg")
PNG_DPI = 200


def new_figure(width: float, height: float) -> Figure:
    """A bare Figure on the Agg canvas: no pyplot global state and no display backend, which
    the machines running sweeps do not have."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def figure_bytes(figure: Figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    # A fixed creation date in PDF and SVG keeps the files of one figure byte-identical.
    metadata = {"CreationDate": None} if fmt == "pdf" else {"Date": None} if fmt == "svg" else {}
    figure.savefig(buffer, format=fmt, dpi=PNG_DPI, metadata=metadata)
    return buffer.getvalue()


def figure_files(figure: Figure, path: Path) -> list[tuple[Path, bytes]]:
    """``path`` (any suffix) as PNG, PDF and SVG beside each other."""
    return [(path.with_suffix(f".{fmt}"), figure_bytes(figure, fmt)) for fmt in FORMATS]
