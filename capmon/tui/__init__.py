"""The capmon dashboard (Textual). The core never imports this package."""
