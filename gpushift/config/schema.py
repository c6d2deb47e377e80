"""The TOML config file → frozen, validated types: the one name the rest of gpushift imports.

The types live in :mod:`gpushift.config.types`, the reader in :mod:`gpushift.config.reader`
(every problem a :class:`gpushift.errors.ConfigError` naming the file, the key's line and what was
expected; unknown keys are errors too); this module gathers both under their old names.
"""

from __future__ import annotations

from gpushift.config.keys import STRING_MAX as STRING_MAX
from gpushift.config.reader import BACKEND_KINDS as BACKEND_KINDS
from gpushift.config.reader import load as load
from gpushift.config.reader import parse as parse
from gpushift.config.reader import read as read
from gpushift.config.textfile import DEFAULT_CONFIG_PATH as DEFAULT_CONFIG_PATH
from gpushift.config.textfile import ENV_CONFIG as ENV_CONFIG
from gpushift.config.textfile import config_path as config_path
from gpushift.config.types import DAY_S as DAY_S
from gpushift.config.types import MIB_MAX as MIB_MAX
from gpushift.config.types import POLL_MAX_S as POLL_MAX_S
from gpushift.config.types import BackendConfig as BackendConfig
from gpushift.config.types import Config as Config
from gpushift.config.types import DaemonConfig as DaemonConfig
from gpushift.config.types import FrontDoorConfig as FrontDoorConfig
from gpushift.config.types import GpuConfig as GpuConfig
from gpushift.config.types import MetricsConfig as MetricsConfig
from gpushift.config.types import WarmupConfig as WarmupConfig
from gpushift.config.types import split_listen as split_listen
