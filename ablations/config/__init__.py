"""A training run's configuration: one tree of frozen dataclasses (:mod:`.run_config`: ``RunConfig``), the generic
reading of settings trees (:mod:`.tree`: options by name, values checked against type hints, the one merge of
layered settings) and the command-line options generated from the tree (:mod:`.options`)."""

from .options import add_options, option_name
from .run_config import (
    ACCELERATORS,
    ATTENTION_NAMES,
    DATASET_NAMES,
    GROUPS,
    INIT_VALUE_OPTIONS,
    NORM_LAYER_NAMES,
    OPTIMIZERS,
    OPTIONS,
    PRECISIONS,
    RESIDUAL_NAMES,
    RUN_MODEL,
    SUBTREES,
    RunConfig,
    TrainerConfig,
    flat,
    layer,
    mapping_options,
)

__all__ = ["ACCELERATORS", "ATTENTION_NAMES", "DATASET_NAMES", "GROUPS", "INIT_VALUE_OPTIONS", "NORM_LAYER_NAMES",
           "OPTIMIZERS", "OPTIONS", "PRECISIONS", "RESIDUAL_NAMES", "RUN_MODEL", "SUBTREES", "RunConfig",
           "TrainerConfig", "add_options", "flat", "layer", "mapping_options", "option_name"]
