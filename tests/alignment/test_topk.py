"""Top-K transport, validation, projection and the sparse KD loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedkt.alignment import PAD_VALUE, Alignment, TopKLogits, project_topk, sparse_kd_loss


def make_topk(n: int = 3, length: int = 5, k: int = 4, vocab: int = 50,
              seed: int = 0) -> TopKLogits:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, length, vocab, generator=g) * 3
    lengths = torch.tensor([length, length - 1, 2][:n], dtype=torch.int32)
    return TopKLogits.from_logits(logits, k, lengths=lengths,
                                  sample_ids=torch.arange(10, 10 + n),
                                  losses=torch.rand(n, generator=g))


# --------------------------------------------------------------------------- transport


def test_bytes_per_entry_and_roundtrip():
    """Through the one wire format, :func:`fedkt.alignment.knowledge.pack_topk`: only real
    positions travel, 6 bytes an entry."""
    from fedkt.alignment.knowledge import pack_topk, packed_entries, unpack_topk
    from fedkt.federated.payload import PayloadError

    t = make_topk()
    assert t.bytes_per_entry == 6
    assert t.values.dtype == torch.float16 and t.indices.dtype == torch.int32
    d = pack_topk(t)
    assert set(d) == {"sample_ids", "values", "indices", "lengths", "losses"}
    entries = int(t.lengths.sum())
    assert packed_entries(d) == (entries * 4, entries * 4 * t.bytes_per_entry)
    back = unpack_topk(d, 50, 4, "client 0")
    for name in d:
        assert torch.equal(getattr(back, name), getattr(t, name)[:, : back.values.shape[1]]
                           if name in ("values", "indices") else getattr(t, name))
    assert back.nbytes == t.nbytes
    with pytest.raises(PayloadError, match="lacks"):
        unpack_topk({"values": d["values"]}, 50, 4, "client 0")


def test_from_logits_keeps_the_largest():
    logits = torch.tensor([[[0.0, 5.0, 1.0, 3.0]]])
    t = TopKLogits.from_logits(logits, 2)
    assert t.indices.tolist() == [[[1, 3]]]
    assert t.values.float().tolist() == [[[5.0, 3.0]]]


def _broken(**changes) -> TopKLogits:
    t = make_topk()
    for name, value in changes.items():
        setattr(t, name, value)
    return t


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        (lambda t: {"values": t.values[:, :, :3], "indices": t.indices[:, :, :3]},
         "values", "K=3, expected K=4"),
        (lambda t: {"values": t.values[0]}, "values", "should be"),
        (lambda t: {"indices": t.indices[:, :2]}, "indices", "shape"),
        (lambda t: {"lengths": t.lengths[:2]}, "lengths", "shape"),
        (lambda t: {"values": t.values.float()}, "values", "dtype"),
        (lambda t: {"indices": t.indices.long()}, "indices", "dtype"),
        (lambda t: {"indices": t.indices.index_put((torch.tensor(0), torch.tensor(1),
                                                     torch.tensor(2)), torch.tensor(50,
                                                     dtype=torch.int32))},
         "indices", "id 50 outside"),
        (lambda t: {"indices": t.indices.index_put((torch.tensor(1), torch.tensor(0),
                                                     torch.tensor(0)), torch.tensor(-1,
                                                     dtype=torch.int32))},
         "indices", "id -1 outside"),
        (lambda t: {"values": t.values.index_put((torch.tensor(0), torch.tensor(0),
                                                   torch.tensor(0)),
                                                  torch.tensor(float("nan"),
                                                               dtype=torch.float16))},
         "values", "non-finite"),
        (lambda t: {"values": t.values.index_put((torch.tensor(2), torch.tensor(1),
                                                   torch.tensor(3)),
                                                  torch.tensor(float("inf"),
                                                               dtype=torch.float16))},
         "values", "non-finite"),
        (lambda t: {"losses": torch.tensor([0.1, float("inf"), 0.2])}, "losses", "non-finite"),
        (lambda t: {"lengths": torch.tensor([9, 1, 1], dtype=torch.int32)}, "lengths",
         "outside"),
        (lambda t: {"sample_ids": torch.tensor([1, 1, 2])}, "sample_ids", "duplicates"),
        (lambda t: {"vocab_size": 49}, "vocab_size", "expected 50"),
    ],
)
def test_validation_names_source_and_field(change, field, why):
    t = _broken(**change(make_topk()))
    with pytest.raises(ValueError) as err:
        t.validate(50, 4, "client 2")
    msg = str(err.value)
    assert msg.startswith("client 2:")
    assert repr(field) in msg
    assert why in msg


def test_padding_positions_are_not_validated():
    t = make_topk()
    # Sample 2 has length 2: garbage past it is ignored.
    t.indices[2, 3, 0] = 10**6
    t.values[2, 4, 1] = float("inf")
    t.validate(50, 4, "server")


# --------------------------------------------------------------------------- projection


def _alignment(logit_map: list[int]) -> Alignment:
    n = len(logit_map)
    z = np.zeros(n, dtype=np.int32)
    return Alignment(z, z, np.asarray(logit_map, dtype=np.int32), z)


def test_project_merges_duplicates_by_logsumexp():
    # One sample, 3 source positions, K=3, source vocab 6 -> target vocab 4.
    values = torch.tensor([[[3.0, 2.0, 1.0], [4.0, 0.0, -1.0], [1.0, 1.0, 1.0]]],
                          dtype=torch.float16)
    indices = torch.tensor([[[0, 1, 2], [3, 4, 5], [0, 2, 4]]], dtype=torch.int32)
    t = TopKLogits(torch.tensor([5]), values, indices, torch.tensor([3], dtype=torch.int32), 6,
                   torch.tensor([1.25]))
    vocab_map = np.array([0, 0, 1, 2, 3, 3])  # ids 0,1 -> 0 and 4,5 -> 3 collide
    # Target has 4 positions: 0 <- src 1, 1 <- none, 2 <- src 0, 3 <- src 2.
    proj, mask = project_topk(t, vocab_map, [_alignment([1, -1, 0, 2])], tgt_vocab_size=4)
    proj.validate(4, 3, "projection")
    assert mask.tolist() == [[True, False, True, True]]
    assert proj.lengths.tolist() == [4] and proj.sample_ids.tolist() == [5]
    assert proj.losses.tolist() == [1.25]
    # Position 2 <- source position 0: {0: lse(3, 2), 1: 1}; one slot left empty.
    ids, vals = proj.indices[0, 2].tolist(), proj.values[0, 2].float()
    assert ids[:2] == [0, 1]
    assert vals[0].item() == pytest.approx(np.logaddexp(3.0, 2.0), abs=1e-2)
    assert vals[1].item() == pytest.approx(1.0)
    assert vals[2].item() == PAD_VALUE
    # Probability mass is preserved: softmax over the merged K equals the summed source one.
    src_p = torch.softmax(values[0, 0].float(), -1)
    dst_p = torch.softmax(proj.values[0, 2].float(), -1)
    assert dst_p[0].item() == pytest.approx((src_p[0] + src_p[1]).item(), abs=2e-3)
    # Position 0 <- source position 1: {2: 4, 3: lse(0, -1)}.
    assert proj.indices[0, 0, :2].tolist() == [2, 3]
    # Unaligned position: all padding.
    assert proj.values[0, 1].float().tolist() == [PAD_VALUE] * 3
    # 'max' keeps the largest instead of summing.
    proj_max, _ = project_topk(t, vocab_map, [_alignment([1, -1, 0, 2])], merge="max")
    assert proj_max.values[0, 2, 0].item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="merge"):
        project_topk(t, vocab_map, [_alignment([0])], merge="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alignments"):
        project_topk(t, vocab_map, [])


def test_project_respects_source_lengths_and_batches():
    t = make_topk(n=3, length=5, k=4, vocab=50)
    vocab_map = np.arange(50) % 20
    aligns = [_alignment([0, 1, 2, 3, -1]), _alignment([3, 4, -1]), _alignment([1, 2, 3])]
    proj, mask = project_topk(t, vocab_map, aligns, tgt_vocab_size=20)
    proj.validate(20, 4, "projection")
    assert proj.values.shape == (3, 5, 4)
    assert proj.lengths.tolist() == [5, 3, 3]
    # Sample 1 has length 4: source position 4 is padding -> unaligned.
    assert mask[1].tolist() == [True, False, False, False, False]
    # Sample 2 has length 2: only source position 1 exists.
    assert mask[2].tolist() == [True, False, False, False, False]
    # Every projected id is the mapped source id.
    src_ids = set((t.indices[0, 2].numpy() % 20).tolist())
    got = {i for i, v in zip(proj.indices[0, 2].tolist(), proj.values[0, 2].tolist(),
                             strict=True) if v > PAD_VALUE}
    assert got == src_ids


def _big_set(n: int, length: int = 48, k: int = 16, vocab: int = 400):
    g = torch.Generator().manual_seed(n)
    values, ids = torch.sort(torch.randn(n, length, k, generator=g), dim=-1, descending=True)
    t = TopKLogits(sample_ids=torch.arange(n), values=values.to(torch.float16),
                   indices=torch.randint(0, vocab, (n, length, k), generator=g,
                                         dtype=torch.int32),
                   lengths=torch.full((n,), length, dtype=torch.int32), vocab_size=vocab,
                   losses=torch.rand(n, generator=g))
    shift = np.r_[np.arange(1, length), -1]
    aligns = [_alignment(np.where(np.arange(length) % 7 == 3, -1, shift).tolist())
              for _ in range(n)]
    vocab_map = np.random.default_rng(0).integers(-1, 200, vocab)  # -1: a dropped special
    return t, aligns, vocab_map


def _peak(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_project_in_batches_is_exact_and_its_memory_does_not_grow_with_n():
    t, aligns, vocab_map = _big_set(64)
    once, m_once = project_topk(t, vocab_map, aligns, tgt_vocab_size=200, batch_size=None)
    batched, m_b = project_topk(t, vocab_map, aligns, tgt_vocab_size=200, batch_size=6)
    assert torch.equal(once.values, batched.values) and torch.equal(once.indices, batched.indices)
    assert torch.equal(m_once, m_b)
    with pytest.raises(ValueError, match="batch_size"):
        project_topk(t, vocab_map, aligns, batch_size=0)
    # Working memory (numpy temporaries; the output is one preallocated tensor): per batch
    # it stays flat from 16 to 64 samples, all at once it grows with N.
    small = _big_set(16)
    per_batch = [_peak(lambda s=s: project_topk(s[0], s[2], s[1], batch_size=8)) for s in
                 (small, (t, aligns, vocab_map))]
    at_once = [_peak(lambda s=s: project_topk(s[0], s[2], s[1], batch_size=None)) for s in
               (small, (t, aligns, vocab_map))]
    assert per_batch[1] < 1.3 * per_batch[0]
    assert at_once[1] > 3 * at_once[0]
    assert per_batch[1] < at_once[1] / 4


# --------------------------------------------------------------------------- loss


def _dense_reference(student, ids, logits, mask, temperature):
    b, length, vocab = student.shape
    p = torch.zeros(b, length, vocab)
    p.scatter_add_(-1, ids.long(), torch.softmax(logits.float() / temperature, -1))
    log_q = torch.log_softmax(student / temperature, -1)
    ce = -(p * log_q).sum(-1)
    m = mask.float()
    return (ce * m).sum() / m.sum()


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_sparse_kd_loss_equals_dense_and_has_gradients(temperature):
    g = torch.Generator().manual_seed(3)
    b, length, vocab, k = 2, 6, 40, 5
    student = torch.randn(b, length, vocab, generator=g, requires_grad=True)
    ids = torch.randint(0, vocab, (b, length, k), generator=g, dtype=torch.int32)
    ids[0, 0, 1] = ids[0, 0, 0]  # a duplicate id: still matches the dense formula
    target = torch.randn(b, length, k, generator=g).to(torch.float16)
    mask = torch.ones(b, length, dtype=torch.bool)
    mask[1, 4:] = False
    loss = sparse_kd_loss(student, ids, target, mask, temperature=temperature)
    ref = _dense_reference(student, ids, target, mask, temperature)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    loss.backward()
    grad = student.grad.clone()
    assert grad.abs().sum() > 0
    assert torch.all(grad[1, 4:] == 0)  # masked positions get no gradient
    student.grad = None
    ref.backward()
    assert torch.allclose(grad, student.grad, atol=1e-6)


def test_sparse_kd_loss_ignores_padding_slots_and_checks_inputs():
    student = torch.randn(1, 2, 10)
    ids = torch.tensor([[[3, 0], [4, 0]]], dtype=torch.int32)
    padded = torch.tensor([[[2.0, PAD_VALUE], [1.0, PAD_VALUE]]], dtype=torch.float16)
    one_hot = sparse_kd_loss(student, ids[..., :1], padded[..., :1])
    assert sparse_kd_loss(student, ids, padded).item() == pytest.approx(one_hot.item())
    assert sparse_kd_loss(student, ids, padded, torch.zeros(1, 2, dtype=torch.bool)).item() == 0
    with pytest.raises(ValueError, match="temperature"):
        sparse_kd_loss(student, ids, padded, temperature=0)
    with pytest.raises(ValueError, match="shapes"):
        sparse_kd_loss(student, ids[:, :1], padded)
