"""Pipeline configuration: the typed schema, the YAML presets and their loader, the extension registries;
the OpenRLHF converter in `from_openrlhf/`."""

from configs.errors import CheckpointError, ConfigError, DataError, PipelineError
from configs.loader import load_config, preset_path
from configs.schema import PipelineConfig

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "PipelineConfig",
    "PipelineError",
    "load_config",
    "preset_path",
]
