"""Modal screens: confirmation, model switch, help."""

from capmon.tui.screens.confirm import ConfirmScreen
from capmon.tui.screens.help import HelpScreen
from capmon.tui.screens.model_switch import ModelChoice, ModelSwitchScreen

__all__ = ["ConfirmScreen", "HelpScreen", "ModelChoice", "ModelSwitchScreen"]
