"""The look the dashboard's framed panels share: a rounded border in the panel's own
colour, a bold title on it, a cell of room inside, and an equal share of the height."""

from __future__ import annotations


def panel_css(widget: str, border: str, extra: str = "") -> str:
    """DEFAULT_CSS for ``widget`` (its class name) framed in ``border``, plus ``extra`` rules."""
    return f"""
    {widget} {{
        border: round {border};
        border-title-style: bold;
        padding: 0 1;
        height: 1fr;
        {extra}
    }}
    """
