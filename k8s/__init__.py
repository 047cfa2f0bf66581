"""SIE on Kubernetes: the ModelService CRD (generated from the spec model) and its operator."""
