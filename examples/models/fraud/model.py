"""FraudMLP: the demo fraud model, a 7->16->1 MLP over engineered transaction features.

Why the feature engineering lives inside the module: the scorer hands the backend the RAW request fields
(amount, hour, ...) as one float32 tensor in schema order. Keeping log-scaling, the cyclic hour encoding and the
standardisation (mean/std buffers, saved in the state dict) inside ``forward`` means every exported form
(TorchScript, torch.export, safetensors + this class) scores the same raw inputs identically, with no
preprocessing code to keep in sync outside the artifact.
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: Raw request fields, in the order the input tensor's columns must follow (the spec's inputSchema order).
INPUT_FIELDS: tuple[str, ...] = (
    "amount",
    "merchant_risk",
    "hour",
    "account_age_days",
    "is_foreign",
    "tx_count_24h",
)
#: Engineered features fed to the first linear layer (see ``FraudMLP.features``).
N_FEATURES = 7


class FraudMLP(nn.Module):
    """Raw features [B, 6] -> fraud probability [B] in [0, 1]."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.feature_mean: torch.Tensor
        self.feature_std: torch.Tensor
        self.register_buffer("feature_mean", torch.zeros(N_FEATURES))
        self.register_buffer("feature_std", torch.ones(N_FEATURES))
        self.net = nn.Sequential(nn.Linear(N_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Engineered features before standardisation: heavy tails log-scaled, hour on the unit circle."""
        amount = torch.log1p(x[:, 0].clamp(min=0.0))
        merchant_risk = x[:, 1]
        angle = x[:, 2] * (2.0 * math.pi / 24.0)
        age = torch.log1p(x[:, 3].clamp(min=0.0))
        is_foreign = x[:, 4]
        tx_count = torch.log1p(x[:, 5].clamp(min=0.0))
        return torch.stack(
            [amount, merchant_risk, torch.sin(angle), torch.cos(angle), age, is_foreign, tx_count], dim=1
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-sigmoid score [B]; training uses it with a numerically stable BCE-with-logits loss."""
        z = (self.features(x) - self.feature_mean) / self.feature_std
        return self.net(z).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))
