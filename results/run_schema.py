"""Names of what a sweep records in MLflow: the contract between the sweep driver (`orchestrator`),
which writes them, and `results`, which reads them. It lives here so that `results` never imports
`orchestrator` (imports run orchestrator -> results -> nli_models).

Layout: one experiment per spec name; one parent run per sweep (tag nli.role=sweep); one child run
per trial (tag nli.role=trial, mlflow.parentRunId = the parent). Per-epoch metrics use step=epoch
(1-based). Seeds of one hyperparameter configuration share the tag nli.config_key; the
architecture a paper-table row describes (model, variant, k, ...) is the tag nli.model_config.
"""

import json

TAG_ROLE = "nli.role"
ROLE_SWEEP = "sweep"
ROLE_TRIAL = "trial"
TAG_PARENT_RUN = "mlflow.parentRunId"

# Sweep (parent) tags.
TAG_SPEC_HASH = "nli.spec_hash"
TAG_SPEC_NAME = "nli.spec_name"
TAG_GIT_COMMIT = "nli.git_commit"
TAG_GIT_DIRTY = "nli.git_dirty"
# the versions the driver ran under (the provenance artifact holds them too; older sweeps only here)
TAG_RAY_VERSION = "nli.ray_version"
TAG_TORCH_VERSION = "nli.torch_version"
TAG_PYTHON_VERSION = "nli.python_version"
TAG_HOST = "nli.host"
TAG_BEST_RUN = "nli.best_run_id"  # child run of the selected configuration's best seed
TAG_SWEEP_STATE = "nli.sweep_state"  # one of SWEEP_STATES (orchestrator/sweep/lifecycle.py moves it)
TAG_PLANNED_TRIALS = "nli.planned_trials"  # trials the spec plans (grid points x seeds, samples)
TAG_DRIVER = "nli.driver"  # "HOST PID" of the process driving the sweep (its lease)
TAG_HEARTBEAT = "nli.heartbeat"  # unix seconds, renewed by the live driver (results/sweeps.py)
TAG_TIME_BUDGET = "nli.time_budget_s"  # search.time_budget_s when set: its end completes a sweep
# search.objectives of a multi-objective sweep, as JSON [[name, "max"|"min"], ...] (absent: one
# objective, search.metric); `results --pareto` draws the front of these.
TAG_OBJECTIVES = "nli.objectives"
TAG_SELECTION_RULE = "nli.selection_rule"  # the rule that chose the tested configuration, in words
# The devices the sweep's trials trained on, counted from their nli.device / nli.device_name
# tags once the trials ended: e.g. "cuda:0 (NVIDIA A10G) x6; cpu (AMD EPYC 7B13) x2".
TAG_TRIAL_DEVICES = "nli.trial_devices"

SWEEP_PLANNED = "planned"
SWEEP_RUNNING = "running"
SWEEP_COMPLETED = "completed"
SWEEP_INTERRUPTED = "interrupted"
SWEEP_FAILED = "failed"
SWEEP_STATES = (SWEEP_PLANNED, SWEEP_RUNNING, SWEEP_COMPLETED, SWEEP_INTERRUPTED, SWEEP_FAILED)
LEGACY_SWEEP_STATES = {"finished": SWEEP_COMPLETED}  # stores written before the lifecycle
# `orchestrate sweep --warm-start EXPERIMENT`: the sweep whose finished trials seeded this sweep's
# sampler ("EXPERIMENT/PARENT_RUN_ID") and how many configurations it was told.
TAG_WARM_START = "nli.warm_start"
TAG_WARM_START_CONFIGURATIONS = "nli.warm_start_configurations"
# `orchestrate sweep --extend`: how many times a completed sweep was extended (absent: never).
# Extension k logs the spec it ran as EXTENSION_SPEC_TEMPLATE.format(k); nli.spec_hash becomes
# that spec's hash.
TAG_EXTENSIONS = "nli.extensions"
EXTENSION_SPEC_TEMPLATE = "extension-{}/spec.yaml"
# Test evaluations. A sweep evaluates test data once; an extension whose selection on dev changed
# evaluates the newly selected runs again: a second evaluation, never a replacement. The parent's
# sweep.best_dev_accuracy / sweep.test_accuracy of evaluation e are logged at step e - 1 (the
# metric's history keeps every evaluation, its latest value is the latest evaluation);
# nli.test_evaluations counts them (absent: one, when test_accuracy exists). Each tested trial
# run says which evaluation tested it (nli.test_evaluation, absent: 1); runs selected by an
# earlier evaluation keep their test metrics and get nli.selected=false.
TAG_TEST_EVALUATIONS = "nli.test_evaluations"
TAG_TEST_EVALUATION = "nli.test_evaluation"


def evaluation_of(tags: dict) -> int:
    """Which test evaluation a run's test metrics (or a parent's latest ones) belong to."""
    value = tags.get(TAG_TEST_EVALUATION, tags.get(TAG_TEST_EVALUATIONS, "1"))
    return int(value) if str(value).isdigit() else 1


# JSON list of the CLI's `--set key=value` / `--data-dir` overrides (absent without any); the spec
# artifact and nli.spec_hash are of the spec with them applied.
TAG_OVERRIDES = "nli.overrides"

TAG_CORPUS = "nli.corpus"  # data.corpus of the sweep, on the parent and every trial run

# A run's protocol fingerprint (nli_models.training.fingerprint), one tag per field on every
# trial run: nli.protocol.<field>, the value as text ("None" when unset).
TAG_PROTOCOL_PREFIX = "nli.protocol."
PROTOCOL_FIELDS = (
    "corpus",
    "train_file",
    "train_size",
    "train_subsampled_from",
    "dev_file",
    "dev_holdout",
    "dev_size",
    "test_size",
    "vectors",
    "vectors_dim",
    "vectors_words",  # words in the vectors file (nli_models.data.vectors.VectorsIdentity)
    "vectors_sha256",  # SHA-256 of the vectors file
    "vector_coverage",  # share of the vocabulary with a pretrained vector (0-1, 4 decimals)
    "vectors_policy",
    "vectors_tuned",
    "extend_vocab",
    "epochs",
    "max_steps",
    "patience",
    "layerwise",
    "refit_on_train_dev",
    "init",
    "optimizer",
    "lr",
    "batch_size",
)

# Trial (child) tags.
TAG_TRIAL_ID = "nli.trial_id"
TAG_MODEL_CONFIG = "nli.model_config"  # e.g. "rocktaschel/word_by_word k=100"
TAG_CONFIG_KEY = "nli.config_key"  # hash of the trial's hyperparameters except the seed
TAG_EARLY_STOPPED = "nli.early_stopped"  # "true" when a scheduler (ASHA, median) stopped it
TAG_SELECTED = "nli.selected"  # "true" on every seed of the configuration chosen on dev
TAG_ERROR = "nli.error"
# A trial whose training loss became NaN/inf: stopped at once, status FAILED, never selected.
TAG_DIVERGED = "nli.diverged"  # "true"; nli.error says at which epoch and step
METRIC_DIVERGED_EPOCH = "diverged_epoch"
METRIC_DIVERGED_STEP = "diverged_step"  # 1-based batch within the epoch
# A trial Tune retried from its last checkpoint (a crash, a killed worker): one update per retry.
TAG_RETRIES = "nli.retries"  # how many times it was retried
TAG_RETRY_CAUSE = "nli.retry_cause"  # the error of the latest failure (its last lines)
TAG_RESUMED_FROM_EPOCH = "nli.resumed_from_epoch"  # the epoch of the checkpoint it restarted from
# What a trial really trained on (nli_models.training.device_info, read in the trial's own
# process, where it sees only the GPUs Ray gave it), from its first epoch: "cuda:0" or "cpu"; the
# GPU's name or the CPU model; fp32 | bf16 (the autocast used); torch threads; OpenMP wait policy.
TAG_DEVICE = "nli.device"
TAG_DEVICE_NAME = "nli.device_name"
TAG_PRECISION = "nli.precision"
TAG_CPU_THREADS = "nli.cpu_threads"
TAG_OMP_WAIT_POLICY = "nli.omp_wait_policy"
DEVICE_TAGS = {  # describe_device's keys -> the tags
    "device": TAG_DEVICE,
    "name": TAG_DEVICE_NAME,
    "precision": TAG_PRECISION,
    "threads": TAG_CPU_THREADS,
    "omp_wait_policy": TAG_OMP_WAIT_POLICY,
}
# Every param of a trial (constants included, plain names) as one JSON object with its types
# (params_json): readers take values from here and never guess a type from MLflow's strings;
# the flat string params stay for the UI. Runs written before it existed lack it.
TAG_PARAMS_JSON = "nli.params"

# Hyperparameters logged as params with these names for every model.
PARAM_MODEL = "model"
PARAM_VARIANT = "variant"
PARAM_SEED = "seed"
PARAM_HIDDEN_SIZE = "hidden_size"
COMMON_PARAMS = ("model", "variant", "lr", "dropout", "l2", "hidden_size", "batch_size", "seed")

# Per-epoch metrics (step = epoch). Accuracies are fractions in [0, 1].
METRIC_TRAIN_LOSS = "train_loss"
# The train accuracy is a running average over the epoch's batches as they are trained on (weights
# changing, dropout on), not an evaluation of the train set: named so, unlike the papers' train
# accuracy (a "not comparable" difference in the paper comparison).
METRIC_TRAIN_ACCURACY = "train_accuracy_running"
METRIC_DEV_LOSS = "dev_loss"
METRIC_DEV_ACCURACY = "dev_accuracy"
METRIC_EPOCH_TIME = "epoch_time_s"
# A trial's Tune results (orchestrator/ray_adapter/ray_runtime.py reports one per epoch) carry these per-epoch
# metrics and its results.trial_result.TrialResult under the names of this module, the epoch
# number as METRIC_EPOCHS_TRAINED (the step of the per-epoch metrics), and these keys, which are
# Tune's alone (MLflow records what they mean as tags):
RESULT_TRIAL_FINISHED = "trial_finished"  # 1: ended by itself (all epochs, patience); else stopped
RESULT_DIVERGED_LOSS = "diverged_loss"  # with METRIC_DIVERGED_*: the last result of a diverged trial

# Final trial metrics.
METRIC_BEST_DEV_ACCURACY = "best_dev_accuracy"
METRIC_BEST_TRAIN_ACCURACY = "best_train_accuracy_running"  # running train accuracy, best-dev epoch
METRIC_BEST_EPOCH = "best_epoch"
METRIC_EPOCHS_TRAINED = "epochs_trained"
METRIC_THETA_M = "theta_m"
METRIC_THETA_WM = "theta_wm"
METRIC_TRIAL_TIME = "trial_time_s"
# The objectives search.objectives may name -> the metric holding a trial's final value of each:
# dev accuracy is the best epoch's (whose weights are kept and tested), parameter counts are
# fixed, the wall time is Tune's time_total_s at the trial's end.
OBJECTIVE_METRICS = {
    "dev_accuracy": METRIC_BEST_DEV_ACCURACY,
    "theta_m": METRIC_THETA_M,
    "theta_wm": METRIC_THETA_WM,
    "trial_time_s": METRIC_TRIAL_TIME,
}

# Only on the selected configuration's runs (and the parent): the paper protocol evaluates test
# data for that configuration alone.
METRIC_TEST_ACCURACY = "test_accuracy"
# With search.protocol.refit_on_train_dev, on each selected run: the test accuracy is that of a
# retrain on train + dev (nli_models/training/refit.py), for the run's best_epoch (layerwise: per
# phase best_epoch / blocks, rounded up); these say how many epochs it trained in all and how
# long it took. The parent holds those of its best run (sweep.refit_*).
METRIC_REFIT_EPOCHS = "refit_epochs"
METRIC_REFIT_TIME = "refit_time_s"
CLASS_ACCURACY_PREFIX = "test_accuracy."  # + label name, e.g. test_accuracy.entailment
DEV_CLASS_ACCURACY_PREFIX = "dev_accuracy."  # per-class dev accuracy (Parikh Table 2), selected runs
ARTIFACT_TEST_PREDICTIONS = "predictions/test_predictions.parquet"  # columns: index, label, prediction
ARTIFACT_SPEC = "spec.yaml"
ARTIFACT_CHECKPOINT_DIR = "checkpoint"

# Model arguments that define a row of a paper's table (together with model and variant); every
# other logged param is a hyperparameter selected on dev within that row.
ARCHITECTURE_PARAMS = ("hidden_size", "shared_encoder", "two_way", "num_blocks")


def params_json(params: dict) -> str:
    """The nli.params tag of a trial: its params, typed, keys sorted (MLflow keeps 8000 chars of
    a tag; a trial's params are a few hundred)."""
    return json.dumps(params, sort_keys=True, default=str)


def model_config_label(params: dict) -> str:
    """The nli.model_config tag, e.g. 'rocktaschel/word_by_word hidden_size=100 two_way=False'."""
    head = f"{params['model']}/{params.get('variant', '-')}"
    arch = " ".join(f"{k}={params[k]}" for k in ARCHITECTURE_PARAMS if k in params)
    return f"{head} {arch}".strip()


# -- What a researcher reads in the MLflow UI (orchestrator.tracking.tracker writes, results reads) -----
# Params of a trial that the search did not vary are logged as const.<name>, the searched ones
# (and the seed) under their plain name; readers strip the prefix (old stores have none).
CONSTANT_PARAM_PREFIX = "const."
# Sweep (parent) summary metrics, named apart from the trials' curves. Stores written before
# they existed hold the plain names: read LEGACY_SWEEP_METRICS[name] when name is absent.
METRIC_SWEEP_BEST_DEV_ACCURACY = "sweep.best_dev_accuracy"
METRIC_SWEEP_TEST_ACCURACY = "sweep.test_accuracy"
METRIC_SWEEP_REFIT_EPOCHS = "sweep.refit_epochs"  # the best run's refit_epochs (refit sweeps)
METRIC_SWEEP_REFIT_TIME = "sweep.refit_time_s"
LEGACY_SWEEP_METRICS = {
    METRIC_SWEEP_BEST_DEV_ACCURACY: METRIC_BEST_DEV_ACCURACY,
    METRIC_SWEEP_TEST_ACCURACY: METRIC_TEST_ACCURACY,
}
# Sweep (parent) params: the sweep's summary, searchable and shown as columns.
SWEEP_PARAMS = (
    "model", "variant", "corpus", "sampler", "scheduler", "budget_trials", "time_budget_s",
    "grid_size", "seeds", "metric", "search_space",
)
# MLflow's own tags, which its UI shows (Source, User, Version columns; the run description).
TAG_MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"
TAG_MLFLOW_USER = "mlflow.user"
TAG_MLFLOW_SOURCE_NAME = "mlflow.source.name"
TAG_MLFLOW_SOURCE_TYPE = "mlflow.source.type"
TAG_MLFLOW_NOTE = "mlflow.note.content"
TAG_MLFLOW_RUN_NAME = "mlflow.runName"
# Experiment tags: the kind of experiment (MLflow 3.17.2's UI ignores it: it picks its runs
# table or GenAI pages from ?workflowType= or the browser's localStorage key below), and a saved
# runs view (columns, filter, order) in the envelope its "Views" menu lists by name.
EXPERIMENT_TAG_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND_ML = "custom_model_development"
EXPERIMENT_TAG_SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
RUNS_VIEW_KEY = "nli-trials"  # the view `sweep` and `ui` link to
RUNS_VIEW_NAME = "trials, best dev accuracy first"  # its name in the Views menu
UI_WORKFLOW_PARAMETER = "workflowType=machine_learning"  # on every link to the UI
UI_WORKFLOW_STORAGE_KEY = "mlflow.workflowType_v1"  # what `orchestrate ui` sets (JSON string)
# Provenance the sweep writes on its parent run (JSON): data files and their SHA-256, split
# sizes, vocabulary and vector coverage; package versions, hardware and device.
ARTIFACT_DATA_RECORD = "provenance/data.json"
ARTIFACT_ENVIRONMENT = "provenance/environment.json"
DATASET_CONTEXT = "train"  # mlflow.data.context of the dataset input on every run
ARTIFACT_ANALYSIS_DIR = "analysis"  # on a parent run: importance, parallel coordinates, curves
ARTIFACT_PARETO_DIR = "pareto"  # on a parent run: the front's figure and table (results --pareto)
