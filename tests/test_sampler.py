"""PromptSampler: seeded per-epoch orders, every row once per epoch, epochs, save / restore."""

import pytest

from roll_lite.data.sampler import PromptSampler


def test_unshuffled_draws_run_on_into_the_next_epoch_and_stop_after_the_last():
    sampler = PromptSampler(5, shuffle=False, epochs=2)
    assert sampler.draw(3) == [0, 1, 2]
    assert sampler.draw(3) == [3, 4, 0]  # spans epochs 0 and 1; no row skipped
    assert (sampler.epoch, sampler.position) == (1, 1)
    assert sampler.draw(3) == [1, 2, 3]
    assert sampler.draw(3) == [4] and sampler.exhausted  # the last epoch ends: fewer rows, then none
    assert sampler.draw(3) == []


def test_same_seed_same_order_and_every_row_exactly_once_per_epoch():
    n = 37
    a, b = PromptSampler(n, seed=3), PromptSampler(n, seed=3)
    draws_a = [a.draw(8) for _ in range(20)]  # 160 rows: 4 epochs and a bit
    assert draws_a == [b.draw(8) for _ in range(20)]
    flat = [i for draw in draws_a for i in draw]
    epochs = [flat[e * n : (e + 1) * n] for e in range(4)]
    for order in epochs:
        assert sorted(order) == list(range(n))
    assert len({tuple(order) for order in epochs}) == 4  # a new order every epoch
    assert all(order != list(range(n)) for order in epochs)  # shuffled
    assert flat[:n] != PromptSampler(n, seed=4).draw(n)  # another seed, another order


def test_state_restore_continues_identically():
    first = PromptSampler(23, seed=7, epochs=5)
    for _ in range(6):
        first.draw(5)  # 30 rows: epoch 1, position 7
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (1, 7)
    expected = [first.draw(5) for _ in range(30)]
    restored = PromptSampler(23, seed=7, epochs=5)
    restored.load_state_dict(dict(state))
    assert [restored.draw(5) for _ in range(30)] == expected
    assert restored.exhausted and sum(map(len, expected)) == 23 * 5 - 30


def test_load_state_dict_refuses_another_dataset_or_seed():
    state = PromptSampler(10, seed=1).state_dict()
    with pytest.raises(ValueError, match="the saved sampler has num_rows=10, this one 11"):
        PromptSampler(11, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="the saved sampler has seed=1, this one 2"):
        PromptSampler(10, seed=2).load_state_dict(state)
