"""The chat format: OpenAI's chat completions (/chat/completions). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.
#
#
#
# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.
#
#
#
# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#
