"""The vLLM plugin's LoRA ops (deploy/vllm_cpu_lora.py): rows of slot index -1 get no delta,
every other row gets exactly what vLLM's own ops give it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: torch and vLLM are imported in the tests


@pytest.fixture(scope="module")
def ops() -> SimpleNamespace:
    """vLLM's torch LoRA ops module (`vllm`), its ops as they were before any test registered the
    plugin (`original`), and the plugin (`fixed`)."""
    from vllm.lora.ops.torch_ops import lora_ops

    from deploy import vllm_cpu_lora

    return SimpleNamespace(vllm=lora_ops, original={name: getattr(lora_ops, name) for name in vllm_cpu_lora.FIXED}, fixed=vllm_cpu_lora)


def weights(slots: int, out: int, inp: int):
    import torch

    return torch.randn(slots, 1, out, inp, generator=torch.Generator().manual_seed(slots * 100 + out))


@pytest.mark.parametrize("name, extra", [("bgmv_shrink", (0.5,)), ("bgmv_expand", (True,)), ("bgmv_expand", (False,)),
                                          ("bgmv_expand_slice", (2, 4, True)), ("bgmv_expand_slice", (2, 4, False))])
@pytest.mark.parametrize("slots_of_rows", [[0, -1, 2, 1, -1], [1, 1, 1, 1, 1], [-1, -1, -1, -1, -1], [2, 0, 2, 0, 2]])
def test_adapter_rows_match_vllm_and_base_rows_get_no_delta(ops, name, extra, slots_of_rows):
    """Mixed batches (one product per slot), one adapter's batch and a base-only batch alike."""
    import torch

    slots, inp = 3, 4
    out = 4 if name == "bgmv_shrink" or name == "bgmv_expand_slice" else 6
    lora = weights(slots, out, inp)
    inputs = torch.randn(5, inp, generator=torch.Generator().manual_seed(7))
    indices = torch.tensor(slots_of_rows)
    width = 8 if name == "bgmv_expand_slice" else out
    start = torch.randn(5, width, generator=torch.Generator().manual_seed(8))
    ours, theirs = start.clone(), start.clone()
    getattr(ops.fixed, name)(inputs, lora, ours, indices, *extra)
    ops.original[name](inputs, lora, theirs, indices, *extra)
    adapter_rows = indices >= 0
    assert torch.allclose(ours[adapter_rows], theirs[adapter_rows], atol=1e-5)  # one product per slot vs per row: rounding
    base_rows = ours[~adapter_rows]
    add = extra[-1] if name != "bgmv_shrink" else False
    if name == "bgmv_expand_slice":  # outside the slice nothing is touched
        assert torch.equal(ours[:, :2], start[:, :2]) and torch.equal(ours[:, 6:], start[:, 6:])
        base_rows, expected = base_rows[:, 2:6], start[~adapter_rows][:, 2:6]
    else:
        expected = start[~adapter_rows]
    assert torch.equal(base_rows, expected if add else torch.zeros_like(expected))
    if (~adapter_rows).any():
        assert not torch.allclose(theirs[~adapter_rows], ours[~adapter_rows])  # vLLM's own ops leak the last slot here


def test_the_probe_tells_a_leaking_op_from_a_right_one(ops):
    assert ops.fixed.leaks_into_base_rows(ops.original["bgmv_shrink"])
    assert not ops.fixed.leaks_into_base_rows(ops.fixed.bgmv_shrink)


def test_register_replaces_the_ops_everywhere_they_are_bound_and_is_idempotent(ops, monkeypatch):
    import torch
    from vllm.lora.ops import torch_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (ops.vllm, torch_ops, punica_cpu):
        for name in ops.fixed.FIXED:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, ops.original[name])
    ops.fixed.register()
    ops.fixed.register()
    for module in (ops.vllm, torch_ops, punica_cpu):
        for name, op in ops.fixed.FIXED.items():
            if hasattr(module, name):
                assert getattr(module, name) is op
    # sgmv (prefill) goes through the module's bgmv: a prefill row of index -1 gets nothing either
    lora, output = weights(2, 3, 4), torch.zeros(3, 3)
    ops.vllm.sgmv_shrink(torch.ones(3, 4), lora, output, None, torch.tensor([2, 1]), torch.tensor([0, -1]), 2, 2, 3, 1.0)
    assert output[:2].abs().sum() > 0 and torch.equal(output[2], torch.zeros(3))


def test_a_prompt_logprobs_pass_beside_a_mixed_batch_gets_zero_deltas_where_no_adapter_changes_the_layer():
    """vLLM computes one request's prompt logprobs with all its prompt rows and the batch's
    sampler indices (386 rows, 8 indices in the engine that crashed): with no adapter on the
    layer (lm_head under PEFT's all-linear) every delta is zero; with one, a clear error."""
    import torch

    from deploy.vllm_cpu_lora import bgmv_shrink

    indices = torch.tensor([-1, -1, 0, 0, -1, 0, -1, -1])  # base decodes beside the probe's adapter
    output = torch.ones(386, 4)
    bgmv_shrink(torch.randn(386, 6), torch.zeros(2, 1, 4, 6), output, indices, 1.0)
    assert output.abs().sum() == 0
    with pytest.raises(ValueError, match="386 rows with 8 adapter indices"):
        bgmv_shrink(torch.randn(386, 6), torch.ones(2, 1, 4, 6), torch.zeros(386, 4), indices, 1.0)
