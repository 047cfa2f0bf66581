"""Stream processors: the exactly-once scorer and the control plane."""
