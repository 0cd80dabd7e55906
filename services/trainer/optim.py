"""A minimal Adam, the update of `torch.optim.Adam` with its defaults.

Why not `torch.optim.Adam`: constructing any `torch.optim` optimizer imports `torch._dynamo`
(through `torch._disable_dynamo`), which costs 1-2.6 s per launch here, more than importing
torch itself, and every preemption pays it again. The update below is the textbook one
(Kingma & Ba; torch's single-tensor path without weight decay or amsgrad), and its state is a
plain dict of tensors that `torch.load(weights_only=True)` reads back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


class Adam:
    def __init__(self, params: Sequence[nn.Parameter], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr = lr
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        self.steps += 1
        correction1 = 1 - self.beta1 ** self.steps
        correction2_sqrt = math.sqrt(1 - self.beta2 ** self.steps)
        with torch.no_grad():
            for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
                grad = p.grad
                if grad is None:
                    continue
                m.lerp_(grad, 1 - self.beta1)
                v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
                denom = (v.sqrt() / correction2_sqrt).add_(self.eps)
                p.addcdiv_(m, denom, value=-self.lr / correction1)

    def state_dict(self) -> dict[str, Any]:
        return {"algorithm": "adam", "lr": self.lr, "betas": [self.beta1, self.beta2],
                "eps": self.eps, "steps": self.steps, "exp_avg": list(self.exp_avg),
                "exp_avg_sq": list(self.exp_avg_sq)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("algorithm") != "adam":
            raise ValueError(f"optimizer state is {state.get('algorithm')!r}, not adam")
        moments: list[list[Tensor]] = [state["exp_avg"], state["exp_avg_sq"]]
        for saved in moments:
            if len(saved) != len(self.params) or any(
                    s.shape != p.shape for s, p in zip(saved, self.params, strict=True)):
                raise ValueError("optimizer state does not match the model's parameters")
        self.lr = float(state["lr"])
        self.beta1, self.beta2 = (float(b) for b in state["betas"])
        self.eps = float(state["eps"])
        self.steps = int(state["steps"])
        for mine, theirs in zip(self.exp_avg + self.exp_avg_sq, moments[0] + moments[1],
                                strict=True):
            mine.copy_(theirs)
