"""Execution plane: node agent, worker supervision, backends, GPU probe."""
