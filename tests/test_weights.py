import torch

from roll_lite.model.weights import flatten_state_dict, unflatten_state_dict


def test_flatten_roundtrip_keeps_names_order_shapes_dtypes_and_values():
    state = {
        "a.weight": torch.randn(3, 4),
        "a.bias": torch.randn(4),
        "steps": torch.tensor([7, 8], dtype=torch.long),
        "b.weight": torch.randn(2, 2, 2, dtype=torch.float64),
        "scalar": torch.tensor(1.5),
    }
    flat = flatten_state_dict(state)
    assert sorted(flat.buffers) == ["float32", "float64", "int64"]
    assert flat.buffers["float32"].nbytes == (12 + 4 + 1) * 4
    back = unflatten_state_dict(flat)
    assert list(back) == list(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def test_bfloat16_and_read_only_buffers_come_back_exactly():
    """What a reader gets out of Ray's object store: read-only arrays; bfloat16 has no numpy dtype."""
    state = {"w": torch.randn(5, 3).to(torch.bfloat16), "b": torch.randn(3)}
    flat = flatten_state_dict(state)
    for array in flat.buffers.values():
        array.setflags(write=False)
    back = unflatten_state_dict(flat)
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], state["w"])
    assert torch.equal(back["b"], state["b"])
