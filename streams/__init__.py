"""Stream processors: the exactly-once layer (``eos``), the scorer (``scorer``) and the control plane (``control``)."""
