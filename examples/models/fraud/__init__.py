"""Demo fraud models: a small MLP (torch backend) and a transparent rules scorer (python backend)."""
