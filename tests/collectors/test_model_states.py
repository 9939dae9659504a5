"""The collector's count of a rank's model states (collectors/memory.py), in process on CPU."""

from __future__ import annotations

import torch
from torch import nn

from tracelab.collectors.memory import count_model_states, layer_count, live_state_bytes, modules


def _trained(set_to_none: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)
    return model, opt


def test_bytes_of_params_grads_and_adam_states() -> None:
    model, opt = _trained(set_to_none=True)
    params = (16 * 32 + 32 + 32 * 8 + 8) * 4
    got = count_model_states(model, opt, None, step=3)
    assert got["param_bytes"] == params
    # Gradients were set to None: each counts at its parameter's size, and says so.
    assert got["grad_bytes"] == params and got["grads_counted_at_param_size"] == 4
    # Adam: exp_avg and exp_avg_sq per parameter, plus one fp32 `step` scalar per parameter.
    assert got["optimizer_bytes"] == 2 * params + 4 * 4
    assert got["optimizers"] == ["Adam"] and got["stages"][0]["layers"] == 2
    assert got["stages"][0]["largest_param_bytes"] == 32 * 16 * 4
    # Live now: parameters and optimizer states (no gradient is held).
    assert live_state_bytes(modules(model, None), [opt]) == params + 2 * params + 16


def test_existing_grads_count_once_and_shared_storage_once() -> None:
    model, opt = _trained(set_to_none=False)
    params = (16 * 32 + 32 + 32 * 8 + 8) * 4
    got = count_model_states([model, model], [opt], None, step=0)
    assert got["param_bytes"] == params  # the same module twice: each storage once
    assert got["grad_bytes"] == params and got["grads_counted_at_param_size"] == 0


def test_layers_are_the_largest_module_list() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(5))
            self.norm = nn.LayerNorm(4)

    assert layer_count(Block()) == 5
