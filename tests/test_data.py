import numpy as np
import pytest
import torch

from roll_lite.data import DataProto


def make(n=5):
    return DataProto(
        {"x": torch.arange(n * 3).view(n, 3), "y": torch.arange(n)},
        {"text": [f"row{i}" for i in range(n)]},
        {"note": "kept"},
    )


def test_size_mismatch_names_the_keys():
    with pytest.raises(ValueError, match=r"tensor 'y': 4"):
        DataProto({"x": torch.zeros(5, 2), "y": torch.zeros(4)})
    with pytest.raises(ValueError, match=r"non-tensor 'text': 2"):
        DataProto({"x": torch.zeros(3, 2)}, {"text": ["a", "b"]})
    with pytest.raises(ValueError, match="scalar"):
        DataProto({"x": torch.tensor(1.0)})


def test_select_slice_chunk_concat_roundtrip():
    data = make(5)
    assert set(data.select(["x"]).batch) == {"x"}
    with pytest.raises(KeyError, match="nope"):
        data.select(["nope"])
    pieces = data.chunk(3)
    assert [len(p) for p in pieces] == [2, 2, 1]
    assert [len(p) for p in data.chunk(7)] == [1, 1, 1, 1, 1, 0, 0]
    assert [len(p) for p in data.split(2)] == [2, 2, 1]
    back = DataProto.concat(pieces)
    assert torch.equal(back["x"], data["x"]) and list(back.non_tensor_batch["text"]) == [f"row{i}" for i in range(5)]
    assert back.meta_info == {"note": "kept"}
    assert torch.equal(data.slice(1, 3)["y"], torch.tensor([1, 2]))


def test_index_select_reorders_all_fields():
    data = make(4)
    picked = data.index_select([3, 0, 0])
    assert picked["y"].tolist() == [3, 0, 0]
    assert list(picked.non_tensor_batch["text"]) == ["row3", "row0", "row0"]
    with pytest.raises(IndexError):
        data.index_select([4])


def test_concat_rejects_mismatched_keys_and_shapes():
    a = DataProto({"x": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="part 1"):
        DataProto.concat([a, DataProto({"z": torch.zeros(2, 3)})])
    with pytest.raises(ValueError, match="trailing shapes"):
        DataProto.concat([a, DataProto({"x": torch.zeros(2, 4)})])


def test_union_checks_conflicts():
    a = DataProto({"x": torch.zeros(2)})
    merged = a.union(DataProto({"y": torch.ones(2)}, {"t": np.array(["a", "b"], dtype=object)}))
    assert set(merged.batch) == {"x", "y"} and len(merged) == 2
    with pytest.raises(ValueError, match="'x' differs"):
        a.union(DataProto({"x": torch.ones(2)}))


def test_undo_permutation():
    from roll_lite.data import undo_permutation

    data = make(4)
    shuffled = data.index_select([2, 0, 3, 1])
    assert undo_permutation(shuffled, [2, 0, 3, 1])["y"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not a permutation"):
        undo_permutation(shuffled, [0, 0, 1, 2])


def test_pickling_keeps_every_tensor_and_sends_cpu_tensors_as_numpy():
    import pickle

    base = torch.arange(24.0).reshape(6, 4)
    data = DataProto(
        {
            "view": base[:, 1:3],
            "bf16": torch.ones(6, 2, dtype=torch.bfloat16),
            "ids": torch.arange(6),
            "mask": torch.tensor([True, False] * 3),
        },
        {"text": ["a"] * 6},
        {"loss_mask_keys": ["mask"]},
    )
    back = pickle.loads(pickle.dumps(data, protocol=5))
    for name, tensor in data.batch.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert back.meta_info == data.meta_info and list(back.non_tensor_batch["text"]) == ["a"] * 6
    wide = torch.zeros(64, 1000)
    assert len(pickle.dumps(DataProto({"column": wide[:, :1]}))) < wide.nbytes / 50  # the view travels, not its storage
    # an array over read-only memory (Ray's shared store) becomes a tensor of its own, safe to write to
    frozen = data["ids"].numpy().copy()
    frozen.flags.writeable = False
    from roll_lite.data.proto import _unpickle

    rebuilt = _unpickle({"ids": frozen}, {}, {})
    rebuilt["ids"].add_(1)
    assert frozen.tolist() == list(range(6))
