"""A user's own PyTorch training script, made preemptible, resumable and elastic by Loom's SDK.

It trains a small CNN on a synthetic MNIST-like task (10 classes of 1×16×16 images: a fixed
template per class plus noise), on CPU. The lines marked `# Loom` are all it takes:

    python examples/train_mnist_like.py          # alone: 300 iterations
    loom submit --model m --gpus 2 --iterations 300 --command python examples/train_mnist_like.py

Under Loom (or torchrun) the session learns the job's rank, world size, iteration count,
batch size and checkpoint directory from the environment; on SIGTERM it checkpoints after the
current step and exits 0, and the next launch, at any world size, resumes where it stopped.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import loom.sdk  # Loom


def synthetic_digits(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 16, 16, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    images = templates[labels] + 2.5 * torch.randn(n, 1, 16, 16, generator=gen)
    return TensorDataset(images, labels)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = synthetic_digits(args.samples, args.seed)
    model = make_model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    with loom.sdk.session(iterations=args.iterations, batch_size=args.batch_size,  # Loom
                          seed=args.seed) as s:
        model, opt = s.restore(model, opt)  # Loom: newest checkpoint, if any
        model = s.distributed(model)  # Loom: DDP when the job has several ranks
        for images, labels in s.loader(data):  # Loom: this rank's slice, from where it stopped
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            s.step(loss)  # Loom: count, report; on SIGTERM checkpoint and exit 0


if __name__ == "__main__":
    main()
