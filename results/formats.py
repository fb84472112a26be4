"""The text formats a results table renders to, and their file suffixes, and the papers
`--paper` compares with. A module of its own so that the CLI can list them without importing
pandas or pyarrow (`orchestrate --help` stays light)."""

SUFFIXES = {"md": ".md", "csv": ".csv", "latex": ".tex"}
PAPER_NAMES = ("rocktaschel2016", "parikh2016", "yin2016", "gajbhiye2018")  # results.published_rows.PAPERS
