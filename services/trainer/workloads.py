"""The workload registry: small, learnable versions of the traces' model families.

A `Workload` is a model factory, a batch generator and a loss. The synthetic task (class
templates, a Markov chain, an environment) is drawn once from the job's seed; the batch of
iteration i is drawn from `derive_seed(seed, STREAM, i)` for the whole global batch, and each
rank trains on its contiguous slice. So the data stream depends only on (seed, global batch,
iteration): a resumed or resized job sees exactly the batches it would have seen. Given a
dataset path (`datasets.py`), `cnn` trains on CIFAR-10 or an image folder and `transformer` on
WikiText, drawing each batch's examples from the same per-iteration generator.

No dropout, no batch norm: a step is a deterministic function of the weights, the optimizer
state and the batch, so a checkpoint (weights + optimizer state + iteration) resumes exactly,
and data-parallel ranks stay identical (nothing rank-local such as running statistics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from domain.workloads import FAMILIES
from services.trainer import datasets
from services.trainer.accounting import INIT, WORLD, derive_seed
from services.trainer.errors import DatasetError
from services.trainer.optim import Adam

Batch = tuple[Tensor, ...]


@dataclass(frozen=True)
class Workload:
    name: str
    lr: float
    build: Callable[[], nn.Module]  # called under a seeded RNG by `init_model`
    make_batch: Callable[[torch.Generator, int], Batch]  # global batch, CPU tensors
    loss: Callable[[nn.Module, Batch], Tensor]  # mean loss of a (shard of a) batch

    def init_model(self, seed: int) -> nn.Module:
        """The same initial weights for the same seed, on every rank and every launch."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, INIT))
            return self.build()

    def optimizer(self, model: nn.Module) -> Adam:
        return Adam(list(model.parameters()), lr=self.lr)


def _world(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, WORLD))


# --- cnn: image classification (ResNet/VGG/ShuffleNet) ---------------------------------------

class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x: Tensor) -> Tensor:
        # 16×16 synthetic images are already 4×4 here; larger real images are pooled to it.
        out: Tensor = self.head(F.adaptive_avg_pool2d(self.features(x), 4).flatten(1))
        return out


def _classify(model: nn.Module, batch: Batch) -> Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _cnn(seed: int, data: Path | None = None) -> Workload:
    if data is not None:
        images = datasets.load_images(data)
        return Workload("cnn", 3e-3, lambda: SmallCNN(images.classes), images.batch, _classify)
    templates = torch.randn(10, 3, 16, 16, generator=_world(seed))

    def make_batch(gen: torch.Generator, n: int) -> Batch:
        labels = torch.randint(0, 10, (n,), generator=gen)
        images = templates[labels] + 2.0 * torch.randn(n, 3, 16, 16, generator=gen)
        return images, labels

    return Workload("cnn", 3e-3, SmallCNN, make_batch, _classify)


# --- transformer: causal language model (BERT/GPT-2) -----------------------------------------

class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, seq: int = 32, d: int = 64, heads: int = 4,
                 layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.02 * torch.randn(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, tokens: Tensor) -> Tensor:
        t = tokens.shape[1]
        h = self.tok(tokens) + self.pos[:t]
        mask = self.get_buffer("mask")[:t, :t]
        h = self.encoder(h, mask=mask, is_causal=True)
        out: Tensor = self.out(h)
        return out


def _lm_loss(model: nn.Module, batch: Batch) -> Tensor:
    inputs, targets = batch
    logits: Tensor = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _transformer(seed: int, data: Path | None = None, vocab: int = 64,
                 seq: int = 32) -> Workload:
    if data is not None:
        text = datasets.load_text(data, seq)
        size = len(text.vocab)
        return Workload("transformer", 3e-3, lambda: TinyLM(size, seq), text.batch, _lm_loss)
    successor = torch.randint(0, vocab, (vocab,), generator=_world(seed))

    def make_batch(gen: torch.Generator, n: int) -> Batch:
        # A Markov chain: each token's fixed successor with probability 0.8, else uniform.
        tokens = torch.empty(n, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (n,), generator=gen)
        keep = torch.rand(n, seq, generator=gen) < 0.8
        noise = torch.randint(0, vocab, (n, seq), generator=gen)
        for i in range(seq):
            tokens[:, i + 1] = torch.where(keep[:, i], successor[tokens[:, i]], noise[:, i])
        return tokens[:, :-1], tokens[:, 1:]

    return Workload("transformer", 3e-3, TinyLM, make_batch, _lm_loss)


# --- lstm: sequence classification (Gavel's LM, DeepSpeech2) ---------------------------------

class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 32, hidden: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens: Tensor) -> Tensor:
        _, (h, _) = self.lstm(self.embed(tokens))
        out: Tensor = self.head(h[-1])
        return out


def _lstm(seed: int, data: Path | None = None, vocab: int = 32, seq: int = 24,
          classes: int = 4) -> Workload:
    # Each class has its own token distribution; the label is the class a sequence came from.
    dists = torch.softmax(2.0 * torch.randn(classes, vocab, generator=_world(seed)), dim=1)

    def make_batch(gen: torch.Generator, n: int) -> Batch:
        labels = torch.randint(0, classes, (n,), generator=gen)
        tokens = torch.multinomial(dists[labels], seq, replacement=True, generator=gen)
        return tokens, labels

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        tokens, labels = batch
        return F.cross_entropy(model(tokens), labels)

    return Workload("lstm", 3e-3, LSTMClassifier, make_batch, loss)


# --- rl: actor-critic policy gradient (A2C/A3C/DQN) ------------------------------------------

class ActorCritic(nn.Module):
    def __init__(self, obs: int = 8, actions: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh())
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        h = self.trunk(obs)
        logits: Tensor = self.policy(h)
        value: Tensor = self.value(h)
        return logits, value.squeeze(-1)


def _rl(seed: int, data: Path | None = None, obs_dim: int = 8, actions: int = 4) -> Workload:
    # A contextual bandit: reward 1 for the action a hidden linear map prefers, else 0. The agent
    # learns from sampled actions and rewards only (advantage actor-critic, one-step episodes).
    env = torch.randn(obs_dim, actions, generator=_world(seed))

    def make_batch(gen: torch.Generator, n: int) -> Batch:
        # The environment's side of the step: observations, the reward of each action, and the
        # uniform draws that sample the agent's actions (so sampling is part of the stream).
        obs = torch.randn(n, obs_dim, generator=gen)
        rewards = F.one_hot((obs @ env).argmax(dim=1), actions).float()
        draws = torch.rand(n, generator=gen)
        return obs, rewards, draws

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        obs, rewards, draws = batch
        out: tuple[Tensor, Tensor] = model(obs)
        logits, value = out
        probs = torch.softmax(logits, dim=1)
        action = (draws.unsqueeze(1) > probs.detach().cumsum(dim=1)).sum(dim=1)
        action = action.clamp(max=probs.shape[1] - 1)
        reward = rewards.gather(1, action.unsqueeze(1)).squeeze(1)
        log_prob = torch.log_softmax(logits, dim=1).gather(1, action.unsqueeze(1)).squeeze(1)
        entropy = -(probs * torch.log_softmax(logits, dim=1)).sum(dim=1)
        advantage = reward - value.detach()
        policy_loss = -(log_prob * advantage).mean()
        value_loss = F.mse_loss(value, reward)
        return policy_loss + 0.5 * value_loss - 0.01 * entropy.mean()

    return Workload("rl", 1e-2, ActorCritic, make_batch, loss)


REGISTRY: dict[str, Callable[[int, Path | None], Workload]] = {
    "cnn": _cnn,
    "transformer": _transformer,
    "lstm": _lstm,
    "rl": _rl,
}
assert REGISTRY.keys() == FAMILIES.keys()


# Workloads that read a real dataset when given a path (the others only have synthetic data).
REAL_DATA = {"cnn": "CIFAR-10 binary batches or an image folder", "transformer": "WikiText raw"}


def make(name: str, seed: int, data: str | Path | None = None) -> Workload:
    """The workload `name`: its synthetic task drawn from `seed`, or the dataset at `data`."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(REGISTRY)
        raise ValueError(f"unknown workload {name!r}: choose one of {known}") from None
    if data is not None and name not in REAL_DATA:
        readers = "; ".join(f"{k}: {v}" for k, v in REAL_DATA.items())
        raise DatasetError(f"--data {data}: workload {name!r} has only synthetic data "
                           f"(real datasets: {readers})")
    return factory(seed, None if data is None else Path(data))
