"""stages/sft/stage.py: step counting and the seeded, sharded, resumable sample stream."""

from __future__ import annotations

import pytest
import torch

from stages.common.trainer import SampleStream, total_steps

# --- total_steps ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_rows", "mbs", "accum", "world", "epochs", "expected"),
    [
        (64, 32, 1, 1, 1, 2),  # exact division
        (100, 8, 2, 1, 1, 7),  # ceil(100 / 16) = ceil(6.25)
        (100, 8, 2, 2, 3, 10),  # ceil(300 / 32) = ceil(9.375)
        (4000, 32, 1, 1, 1, 125),
        (4000, 32, 1, 2, 1, 63),  # ceil(4000 / 64) = ceil(62.5)
        (4000, 32, 4, 2, 2, 32),  # ceil(8000 / 256) = ceil(31.25)
        (1, 32, 1, 1, 1, 1),
        (0, 32, 1, 1, 1, 1),  # never zero steps
        (33, 32, 1, 1, 1, 2),
    ],
)
def test_total_steps_from_epochs(n_rows, mbs, accum, world, epochs, expected):
    assert total_steps(n_rows, mbs, accum, world, epochs, None) == expected


@pytest.mark.parametrize("max_steps", [1, 7, 600])
def test_total_steps_max_steps_overrides_epochs(max_steps):
    assert total_steps(4000, 32, 1, 1, 1, max_steps) == max_steps
    assert total_steps(10, 1, 1, 1, 100, max_steps) == max_steps


# --- SampleStream --------------------------------------------------------------------------


def test_micro_batch_size_and_range():
    s = SampleStream(n_rows=10, micro_batch_size=4, rank=0, world_size=1, seed=0)
    for g in range(20):
        batch = s.micro_batch(g)
        assert len(batch) == 4
        assert all(0 <= i < 10 for i in batch)


def test_micro_batch_is_deterministic():
    a = SampleStream(50, 8, 0, 1, seed=3)
    b = SampleStream(50, 8, 0, 1, seed=3)
    first = [a.micro_batch(g) for g in range(20)]
    assert first == [b.micro_batch(g) for g in range(20)]
    assert first == [a.micro_batch(g) for g in range(20)]  # asking again gives the same


def test_micro_batches_follow_the_seeded_epoch_permutation():
    s = SampleStream(10, 4, 0, 1, seed=5)
    perm0 = torch.randperm(10, generator=torch.Generator().manual_seed(5)).tolist()
    perm1 = torch.randperm(10, generator=torch.Generator().manual_seed(6)).tolist()
    assert s.micro_batch(0) == perm0[0:4]
    assert s.micro_batch(1) == perm0[4:8]
    assert s.micro_batch(2) == perm0[8:10] + perm1[0:2]  # straddles the epoch boundary
    assert s.micro_batch(3) == perm1[2:6]


@pytest.mark.parametrize(("n_rows", "mbs"), [(12, 4), (10, 4), (7, 3), (5, 8)])
def test_each_row_exactly_once_per_epoch_single_rank(n_rows, mbs):
    s = SampleStream(n_rows, mbs, 0, 1, seed=1)
    n_epochs = 4
    n_batches = -(-n_rows * n_epochs // mbs)
    stream = [i for g in range(n_batches) for i in s.micro_batch(g)]
    for e in range(n_epochs):
        assert sorted(stream[e * n_rows : (e + 1) * n_rows]) == list(range(n_rows)), e


def test_epochs_are_shuffled_differently():
    s = SampleStream(64, 64, 0, 1, seed=0)
    e0, e1 = s.micro_batch(0), s.micro_batch(1)
    assert sorted(e0) == sorted(e1) == list(range(64))
    assert e0 != e1


def test_different_seeds_give_different_orders():
    a = SampleStream(64, 16, 0, 1, seed=0)
    b = SampleStream(64, 16, 0, 1, seed=1)
    assert [a.micro_batch(g) for g in range(4)] != [b.micro_batch(g) for g in range(4)]


def test_two_ranks_get_disjoint_rows_within_a_step():
    r0 = SampleStream(40, 4, 0, 2, seed=9)
    r1 = SampleStream(40, 4, 1, 2, seed=9)
    for g in range(30):
        a, b = r0.micro_batch(g), r1.micro_batch(g)
        assert len(a) == len(b) == 4
        assert not set(a) & set(b), g


def test_two_ranks_together_cover_an_epoch_exactly_once():
    n, mbs, world = 24, 4, 2
    ranks = [SampleStream(n, mbs, r, world, seed=2) for r in range(world)]
    single = SampleStream(n, mbs, 0, 1, seed=2)
    steps_per_epoch = n // (mbs * world)
    for epoch in range(3):
        seen = []
        for g in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
            for s in ranks:
                seen.extend(s.micro_batch(g))
        assert sorted(seen) == list(range(n)), epoch
    # rank r at step g reads the slice (g * world + r) of the single-rank stream
    for g in range(6):
        for r, s in enumerate(ranks):
            assert s.micro_batch(g) == single.micro_batch(g * world + r)


def test_fresh_stream_resumes_at_the_same_batch():
    """A resumed run builds a new SampleStream and asks for batch g directly: it must match."""
    long_run = SampleStream(37, 5, 1, 2, seed=42)
    history = {g: long_run.micro_batch(g) for g in range(25)}
    for g in (0, 3, 7, 11, 24):
        assert SampleStream(37, 5, 1, 2, seed=42).micro_batch(g) == history[g]


def test_out_of_order_access_matches_in_order():
    """The per-epoch cache must not leak across epochs when batches are asked for out of order."""
    s = SampleStream(9, 4, 0, 1, seed=7)
    in_order = [SampleStream(9, 4, 0, 1, seed=7).micro_batch(g) for g in range(12)]
    for g in (11, 0, 5, 2, 10, 1, 7, 3, 9, 4, 8, 6):
        assert s.micro_batch(g) == in_order[g], g


def test_eval_batches_give_every_rank_the_same_number_of_forward_passes():
    from stages.common.trainer import eval_batches

    rows = list(range(65))
    shards = [list(eval_batches(rows, rank, 2, 32)) for rank in range(2)]
    assert [len(s) for s in shards] == [2, 2]  # 33 and 32 rows: rank 1 gets one filler batch
    assert [w for _, w in shards[0]] == [1.0, 1.0] and [w for _, w in shards[1]] == [1.0, 0.0]
    real = sorted(r for shard in shards for chunk, w in shard if w for r in chunk)
    assert real == rows
    assert list(eval_batches([], 0, 2, 4)) == []
