"""``orchestrate attention RUN``: a trial run's attention heatmaps (results/attention.py), written
and logged to the run. orchestrator/cli/orchestrate.py adds it to the ``orchestrate`` group."""

from __future__ import annotations

from pathlib import Path

import click

# Light imports only (`orchestrate --help` loads neither MLflow nor torch); the command imports
# the rest when it runs.
from nli_models.outputs import check_output_path
from results.tracking_uri import TRACKING_URI_HELP, resolve_tracking_uri


@click.command("attention")
@click.argument("run_id")
@click.option("--pairs", type=click.IntRange(1, 500), default=5, show_default=True,
              help="the first PAIRS pairs of the split, in file order (unless --pair-ids)")
@click.option("--pair-ids", default=None, metavar="I,J,...",
              help="these pairs of the split (0-based indices in file order), e.g. 3,17")
@click.option("--split", default="dev", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results/plots/attention"), show_default=True)
@click.option("--tracking-uri", default=None, help=TRACKING_URI_HELP)
def attention_command(
    run_id: str, pairs: int, pair_ids: str | None, split: str, out_dir: Path,
    tracking_uri: str | None,
) -> None:
    """Attention heatmaps of a trial run's best-on-dev checkpoint, one figure per pair (PNG,
    PDF and SVG), logged to the run under attention/."""
    from mlflow.exceptions import MlflowException

    from results.attention import attention_heatmaps, parse_pair_ids
    from results.run_reader import open_client

    try:
        check_output_path(out_dir / run_id, "--out", folder=True)
        chosen = parse_pair_ids(pair_ids) if pair_ids else list(range(pairs))
        client = open_client(resolve_tracking_uri(tracking_uri))
        written = attention_heatmaps(client, run_id, chosen, out_dir / run_id, split)
    except MlflowException as exc:
        raise click.UsageError(str(exc)) from None
    for path in written:
        click.echo(str(path))
