"""capmon: keep LLM API work running when models are at capacity.

The public API::

    from capmon import FallbackClient, ChatRequest, ChatResult, RequestFailed, load_config, open_engine

See README.md ("Use it as a library") and ARCHITECTURE.md.
"""

from capmon.core.exceptions import CannotWait, CapmonError, ConfigError, DeadlineExceeded, RequestFailed
from capmon.core.result import Attempt, ChatRequest, ChatResult
from capmon.core.router import FallbackClient
from capmon.runtime import Engine, open_engine
from capmon.runtime import load as load_config

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "CannotWait",
    "CapmonError",
    "ChatRequest",
    "ChatResult",
    "ConfigError",
    "DeadlineExceeded",
    "Engine",
    "FallbackClient",
    "RequestFailed",
    "load_config",
    "open_engine",
]
