"""Train the demo fraud model and write its artifacts next to this file.

    python -m models.fraud.train            # from examples/; a few seconds on one CPU core

Why synthetic data: the demo needs a model whose behaviour is plausible (large foreign night-time payments at
risky merchants from new accounts are suspicious) and reproducible byte-for-byte, without shipping a data set.
Labels come from a known logistic rule plus noise, so the best achievable AUC is known and printed next to the
model's, which tells you whether training worked.

Artifacts (all small, committed):
  fraud_scorer.pt           TorchScript (torch backend default; needs no Python class to load)
  fraud_scorer.safetensors  state dict for ``models.fraud.model:FraudMLP`` (format: safetensors)
  fraud_scorer.pt2          torch.export archive (format: export), when torch.export works on this torch
  metrics.json              the held-out metrics printed below
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from models.fraud.model import INPUT_FIELDS, FraudMLP
from safetensors.torch import save_file

SEED = 20240611
N_ROWS = 20_000
N_TRAIN = 16_000
STEPS = 400
HERE = Path(__file__).resolve().parent


def make_dataset(n: int = N_ROWS, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw features [n, 6] in INPUT_FIELDS order, labels [n] (0/1) and the true fraud logit [n]."""
    rng = np.random.default_rng(seed)
    amount = np.clip(rng.lognormal(mean=3.6, sigma=1.3, size=n), 0.5, 1_000_000.0).round(2)
    merchant_risk = rng.beta(2.0, 5.0, size=n)
    hour = rng.integers(0, 24, size=n)
    account_age_days = np.minimum(rng.exponential(scale=500.0, size=n), 3650.0).astype(np.int64)
    is_foreign = rng.random(n) < 0.12
    tx_count_24h = rng.poisson(2.0, size=n) + (rng.random(n) < 0.05) * rng.poisson(12.0, size=n)
    night = (hour <= 5).astype(np.float64)
    logit = (
        -6.3
        + 0.75 * np.log1p(amount)
        + 4.0 * merchant_risk
        + 1.2 * night
        + 1.6 * is_foreign
        - 0.45 * np.log1p(account_age_days)
        + 0.22 * tx_count_24h
        + rng.normal(0.0, 0.6, size=n)  # unexplained variation: caps the achievable AUC below 1
    )
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    features = np.stack(
        [amount, merchant_risk, hour, account_age_days, is_foreign, tx_count_24h], axis=1
    ).astype(np.float32)
    return features, labels, logit


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC via the rank-sum (Mann-Whitney U) identity; ties get average ranks."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def train(features: np.ndarray, labels: np.ndarray, steps: int = STEPS) -> FraudMLP:
    """Full-batch Adam on one thread with deterministic kernels: same seed -> same weights."""
    torch.manual_seed(SEED)
    model = FraudMLP()
    x = torch.from_numpy(features)
    y = torch.from_numpy(labels)
    with torch.no_grad():
        engineered = model.features(x)
        model.feature_mean.copy_(engineered.mean(dim=0))
        model.feature_std.copy_(engineered.std(dim=0).clamp(min=1e-6))
    # Unweighted loss on purpose: the output is served as a calibrated fraud_probability, not a ranking score.
    loss_fn = torch.nn.BCEWithLogitsLoss()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        optimiser.zero_grad(set_to_none=True)
        loss = loss_fn(model.logits(x), y)
        loss.backward()
        optimiser.step()
    return model.eval()


def export_all(model: FraudMLP, out_dir: Path, example: torch.Tensor) -> list[Path]:
    """Write the TorchScript, safetensors and (if supported) torch.export artifacts; return what was written."""
    written = []
    with warnings.catch_warnings():  # torch >= 2.9 marks TorchScript deprecated; loading it is still supported
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    pt = out_dir / "fraud_scorer.pt"
    scripted.save(str(pt))
    written.append(pt)
    st = out_dir / "fraud_scorer.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(st), metadata={"class": "models.fraud.model:FraudMLP"})
    written.append(st)
    try:
        batch = torch.export.Dim("batch", min=1, max=1 << 20)
        program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
        pt2 = out_dir / "fraud_scorer.pt2"
        torch.export.save(program, str(pt2))
        written.append(pt2)
    except Exception as exc:  # torch.export is still evolving; the other two formats are enough to serve
        print(f"torch.export unavailable on torch {torch.__version__}: {exc!r}; skipped fraud_scorer.pt2")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory for the artifacts (default: this package)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    features, labels, logit = make_dataset()
    model = train(features[:N_TRAIN], labels[:N_TRAIN])
    with torch.inference_mode():
        test_scores = model(torch.from_numpy(features[N_TRAIN:])).numpy()
    test_labels = labels[N_TRAIN:]
    metrics = {
        "rows_train": N_TRAIN,
        "rows_test": int(len(test_labels)),
        "fraud_rate_test": round(float(test_labels.mean()), 4),
        "auc_test": round(auc(test_scores, test_labels), 4),
        "auc_bayes_test": round(auc(logit[N_TRAIN:], test_labels), 4),
        "accuracy_at_0.5": round(float(((test_scores >= 0.5) == (test_labels > 0.5)).mean()), 4),
        "accuracy_always_legit": round(float((test_labels < 0.5).mean()), 4),
        "input_fields": list(INPUT_FIELDS),
        "torch": torch.__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    written = export_all(model, args.out, torch.from_numpy(features[:2]))
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2))
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
