"""Loss formulas checked against values worked out by hand (arithmetic in comments).

Reference pair used throughout:
  logits [0, ln 3] -> softmax [1/4, 3/4]   (call it P)
  logits [0, 0]    -> softmax [1/2, 1/2]   (call it Q)
  KL(P||Q) = 1/4 ln(1/2) + 3/4 ln(3/2) = -0.1732868 + 0.3040988 = 0.1308120
  KL(Q||P) = 1/2 ln 2 + 1/2 ln(2/3)   =  0.3465736 - 0.2027326 = 0.1438410
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedkt.methods.fedcollm.cotune import mutual_kl
from fedkt.methods.fedkd import losses as FedKD
from fedkt.methods.fedmkt.distill import lambda_mix
from fedkt.methods.koala import losses as Koala
from fedkt.train import losses as L

LN3 = math.log(3.0)
KL_PQ = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)  # 0.1308120
KL_QP = 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)  # 0.1438410


def p_logits() -> torch.Tensor:
    return torch.tensor([[0.0, LN3]], dtype=torch.float64)


def q_logits() -> torch.Tensor:
    return torch.tensor([[0.0, 0.0]], dtype=torch.float64)


def test_reference_numbers_by_hand():
    assert abs(KL_PQ - 0.1308120) < 1e-6
    assert abs(KL_QP - 0.1438410) < 1e-6


def test_kl_div_direction_first_argument_is_target():
    assert L.kl_div(p_logits(), q_logits()).item() == pytest.approx(KL_PQ, abs=1e-9)
    assert L.kl_div(q_logits(), p_logits()).item() == pytest.approx(KL_QP, abs=1e-9)


def test_kl_div_temperature_divides_logits():
    # [0, 2 ln 3] / T=2 = [0, ln 3] -> P again; [0, 0] / 2 -> Q.
    p2 = torch.tensor([[0.0, 2 * LN3]], dtype=torch.float64)
    assert L.kl_div(p2, q_logits(), temperature=2.0).item() == pytest.approx(KL_PQ, abs=1e-9)
    with pytest.raises(ValueError, match="temperature"):
        L.kl_div(p2, q_logits(), temperature=0.0)


def test_kl_div_mask_on_sequences():
    # [B=1, L=2, V=2]: position 0 is the (P, Q) pair, position 1 has identical logits (KL 0).
    p = torch.tensor([[[0.0, LN3], [1.0, 2.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.0, 0.0], [1.0, 2.0]]], dtype=torch.float64)
    # mask [1, 0]: only position 0 -> 0.1308120
    assert L.kl_div(p, q, mask=torch.tensor([[1, 0]])).item() == pytest.approx(KL_PQ, abs=1e-9)
    # mask [1, 1]: (0.1308120 + 0) / 2 = 0.0654060
    assert L.kl_div(p, q, mask=torch.tensor([[1, 1]])).item() == pytest.approx(KL_PQ / 2, abs=1e-9)
    # mask [0, 1]: only the identical position -> 0
    assert L.kl_div(p, q, mask=torch.tensor([[0, 1]])).item() == pytest.approx(0.0, abs=1e-12)
    # no position kept -> 0, not NaN
    empty = L.kl_div(p, q, mask=torch.tensor([[0, 0]]))
    assert empty.item() == 0.0
    with pytest.raises(ValueError, match="mask shape"):
        L.kl_div(p, q, mask=torch.tensor([1, 1]))


def test_soft_cross_entropy_hand_value():
    # -(1/4 ln 1/2 + 3/4 ln 1/2) = ln 2 = 0.6931472
    ce = L.soft_cross_entropy(q_logits(), p_logits())
    assert ce.item() == pytest.approx(math.log(2.0), abs=1e-9)
    # = KL(P||Q) + H(P); H(P) = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.3465736 + 0.2157616 = 0.5623351
    assert ce.item() == pytest.approx(KL_PQ + 0.5623351, abs=1e-6)


def test_hidden_mse_plain_and_masked():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    # (1 + 4 + 9 + 16) / 4 = 7.5
    assert L.hidden_mse(a, torch.zeros_like(a)).item() == pytest.approx(7.5)
    seq = a.unsqueeze(0)  # [B=1, L=2, D=2]
    # only position 0 kept: (1 + 4) / 2 = 2.5
    masked = L.hidden_mse(seq, torch.zeros_like(seq), mask=torch.tensor([[1, 0]]))
    assert masked.item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="shapes differ"):
        L.hidden_mse(a, torch.zeros(3))


def test_fedkd_task_loss_eqs_1_2():
    logits = torch.tensor([[0.0, LN3], [0.0, LN3]], dtype=torch.float64)
    # label 1: -ln(3/4) = 0.2876821; label 0: -ln(1/4) = 1.3862944; mean = 0.8369882
    loss = FedKD.fedkd_task_loss(logits, torch.tensor([1, 0]))
    assert loss.item() == pytest.approx((0.2876821 + 1.3862944) / 2, abs=1e-6)
    seq = logits.unsqueeze(0)  # [1, 2, 2]
    # masking out position 1 leaves only -ln(3/4)
    masked = FedKD.fedkd_task_loss(seq, torch.tensor([[1, 0]]), mask=torch.tensor([[1, 0]]))
    assert masked.item() == pytest.approx(0.2876821, abs=1e-6)
    ignored = FedKD.fedkd_task_loss(seq, torch.tensor([[1, -100]]))
    assert ignored.item() == pytest.approx(0.2876821, abs=1e-6)


def test_fedkd_adaptive_kd_eqs_3_4_values_and_direction():
    teacher = p_logits().requires_grad_()  # y_t = [1/4, 3/4]
    student = q_logits().requires_grad_()  # y_s = [1/2, 1/2]
    lt, ls = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    l_t_d, l_s_d = FedKD.fedkd_adaptive_kd(teacher, student, lt, ls)
    # Eq. 3: KL(y_s || y_t) / (0.3 + 0.2) = 0.1438410 / 0.5 = 0.2876821
    assert l_t_d.item() == pytest.approx(KL_QP / 0.5, abs=1e-9)
    # Eq. 4: KL(y_t || y_s) / 0.5 = 0.1308120 / 0.5 = 0.2616240
    assert l_s_d.item() == pytest.approx(KL_PQ / 0.5, abs=1e-9)
    # detached targets: L_t^d trains only the teacher, L_s^d only the student
    (g_teacher_from_ls,) = torch.autograd.grad(l_s_d, teacher, allow_unused=True)
    assert g_teacher_from_ls is None
    (g_student_from_lt,) = torch.autograd.grad(l_t_d, student, allow_unused=True)
    assert g_student_from_lt is None


def test_fedkd_denominator_detached_by_default_and_optional():
    t, s = p_logits(), q_logits()
    lt = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    ls = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    l_t_d, _ = FedKD.fedkd_adaptive_kd(t, s, lt, ls)
    assert not l_t_d.requires_grad  # no path to the task losses, nor to constant logits
    l_t_d, _ = FedKD.fedkd_adaptive_kd(t, s, lt, ls, detach_denominator=False)
    (g,) = torch.autograd.grad(l_t_d, lt)
    # d/dL (KL / L) = -KL / L^2 = -0.1438410 / 0.25 = -0.5753641
    assert g.item() == pytest.approx(-KL_QP / 0.25, abs=1e-9)
    with pytest.raises(ValueError, match="> 0"):
        FedKD.fedkd_adaptive_kd(t, s, 0.0, 0.0)


def test_fedkd_hidden_loss_eq_5_hand_value():
    h_t = torch.tensor([[1.0, 1.0]])  # teacher dim 2
    h_s = torch.tensor([[2.0]])  # student dim 1
    w_h = torch.tensor([[0.5, 1.0]])  # (d_s=1, d_t=2): H_s W_h = [1, 2]
    a_t = torch.tensor([[0.5, 0.5]])
    a_s = torch.tensor([[1.0, 0.0]])
    # MSE([1,1],[1,2]) = (0 + 1)/2 = 0.5; MSE(A) = (0.25 + 0.25)/2 = 0.25
    # (0.5 + 0.25) / (L_t^t + L_s^t = 0.5) = 1.5
    loss = FedKD.fedkd_hidden_loss(h_t, h_s, a_t, a_s, w_h, 0.5)
    assert loss.item() == pytest.approx(1.5)
    # the same through an nn.Linear with those weights (weight is (out, in) = W_h^T)
    lin = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w_h.T)
    assert FedKD.fedkd_hidden_loss(h_t, h_s, a_t, a_s, lin, 0.5).item() == pytest.approx(1.5)
    # without attention maps: 0.5 / 0.5 = 1.0
    assert FedKD.fedkd_hidden_loss(h_t, h_s, None, None, w_h, 0.5).item() == pytest.approx(1.0)
    # two layer pairs are summed: (0.5 + 0.5) / 0.5 = 2.0
    two = FedKD.fedkd_hidden_loss([h_t, h_t], [h_s, h_s], None, None, w_h, 0.5)
    assert two.item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="W_h has shape"):
        FedKD.fedkd_hidden_loss(h_t, h_s, None, None, torch.ones(2, 2), 0.5)


def test_fedkd_hidden_loss_masks_sequences_and_attention():
    # hidden [B=1, L=2, D=1]: errors 1 at position 0, 9 at position 1; keep only position 0
    h_t = torch.tensor([[[1.0], [3.0]]])
    h_s = torch.zeros(1, 2, 1)
    # attention [B=1, heads=1, L=2, L=2]: only entry (0, 0) has both query and key kept
    a_t = torch.zeros(1, 1, 2, 2)
    a_s = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    mask = torch.tensor([[1, 0]])
    # (1 + 1^2) / 1 = 2.0
    loss = FedKD.fedkd_hidden_loss(h_t, h_s, a_t, a_s, None, 1.0, mask=mask)
    assert loss.item() == pytest.approx(2.0)


def test_fedkd_objectives_eqs_6_7_and_joint_gradient():
    torch.manual_seed(0)
    teacher, student = nn.Linear(4, 3), nn.Linear(4, 3)
    proj = nn.Linear(3, 3, bias=False)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])

    def parts():
        zt, zs = teacher(x), student(x)
        tt, ts = FedKD.fedkd_task_loss(zt, y), FedKD.fedkd_task_loss(zs, y)
        kd_t, kd_s = FedKD.fedkd_adaptive_kd(zt, zs, tt, ts)
        hid = FedKD.fedkd_hidden_loss(zt, zs, None, None, proj, tt + ts)
        return FedKD.fedkd_objectives(tt, ts, kd_t, kd_s, hid)

    out = parts()
    assert out.teacher.item() == pytest.approx(
        (out.teacher_kd + out.hidden + out.teacher_task).item()
    )
    assert out.student.item() == pytest.approx(
        (out.student_kd + out.hidden + out.student_task).item()
    )
    # one backward of `joint` == each model's gradient of its own total (Eqs. 6-7)
    g_t = torch.autograd.grad(out.teacher, list(teacher.parameters()))
    g_s = torch.autograd.grad(parts().student, list(student.parameters()))
    joint = parts().joint
    gj_t = torch.autograd.grad(joint, list(teacher.parameters()), retain_graph=True)
    gj_s = torch.autograd.grad(joint, list(student.parameters()))
    for a, b in zip(g_t + g_s, gj_t + gj_s, strict=True):
        torch.testing.assert_close(a, b)


def test_koala_refine_eq_8_hand_value_and_degenerate_rows():
    z = torch.tensor([[1.0, 2.0, 6.0], [4.0, 4.0, 4.0], [0.1, 0.1, 0.1]])
    out = Koala.koala_refine_logits(z, amplification=2.0)
    # row 0: z_min = 1, z_bar = 3; 2 * ([1, 2, 6] - 1) / (3 - 1) = [0, 1, 5]
    torch.testing.assert_close(out[0], torch.tensor([0.0, 1.0, 5.0]))
    # rows 1-2: all equal (z_bar == z_min) -> zeros, i.e. uniform after softmax
    torch.testing.assert_close(out[1:], torch.zeros(2, 3))
    assert torch.isfinite(out).all()
    # invariant to shifting and positive scaling of a row
    torch.testing.assert_close(Koala.koala_refine_logits(z[:1] * 3 + 10, 2.0), out[:1])


def test_koala_integrate_eq_9_and_soft_labels_eq_10():
    a = torch.tensor([[0.0, 1.0, 5.0]])
    b = torch.tensor([[3.0, 3.0, 0.0]])
    # (1 * [0, 1, 5] + 3 * [3, 3, 0]) / 4 = [9/4, 10/4, 5/4] = [2.25, 2.5, 1.25]
    mixed = Koala.koala_integrate_logits([a, b], [1, 3])
    torch.testing.assert_close(mixed, torch.tensor([[2.25, 2.5, 1.25]]))
    with pytest.raises(ValueError, match="sample counts"):
        Koala.koala_integrate_logits([a, b], [0, 0])
    with pytest.raises(ValueError, match="client 1"):
        Koala.koala_integrate_logits([a, torch.zeros(1, 2)], [1, 1])
    # Eq. 10: softmax([0, 2 ln 3] / 2) = [1/4, 3/4]
    soft = Koala.koala_soft_labels(torch.tensor([[0.0, 2 * LN3]]), temperature=2.0)
    torch.testing.assert_close(soft, torch.tensor([[0.25, 0.75]]))


def test_kl_from_probs_direction():
    """KOALA's one KL (every distillation step): the soft labels are the target."""
    soft = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    # KL(soft || softmax([0, 0])) = KL(P || Q) = 0.1308120, not KL(Q || P) = 0.1438410
    loss = L.kl_div_from_probs(soft, q_logits())
    assert loss.item() == pytest.approx(KL_PQ, abs=1e-9)
    # a zero in the target contributes 0 (0 log 0 = 0): KL([1, 0] || [1/2, 1/2]) = ln 2
    onehot = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    assert L.kl_div_from_probs(onehot, q_logits()).item() == pytest.approx(math.log(2), abs=1e-9)


def test_bridging_matrix_eqs_13_14():
    bridge = Koala.BridgingMatrix(small_dim=3, large_dim=5)
    assert tuple(bridge.weight.shape) == (3, 5)
    with torch.no_grad():
        bridge.weight.zero_()
        bridge.weight[0] = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0])
        bridge.weight[2] = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0])
    small = torch.tensor([[1.0, 7.0, 2.0]])
    # [1, 7, 2] @ W = 1 * W0 + 7 * W1 (=0) + 2 * W2 = [1, 3, 1, 3, 1]
    large = torch.ones(1, 5)
    # squared errors [0, 4, 0, 4, 0] -> mean 8 / 5 = 1.6
    assert Koala.koala_feature_loss(small, large, bridge).item() == pytest.approx(1.6)
    maps = bridge(torch.randn(2, 3, 4, 4))
    assert tuple(maps.shape) == (2, 5, 4, 4)
    with pytest.raises(ValueError, match="expected last dim 3"):
        bridge(torch.randn(2, 4))


def test_mutual_kl_values_and_gradients_to_both_sides():
    f = p_logits().requires_grad_()
    g = q_logits().requires_grad_()
    kl_fg, kl_gf = mutual_kl(f, g)
    assert kl_fg.item() == pytest.approx(KL_PQ, abs=1e-9)
    assert kl_gf.item() == pytest.approx(KL_QP, abs=1e-9)
    grads = torch.autograd.grad(kl_fg, [f, g], retain_graph=True)
    assert all(gr is not None and gr.abs().sum() > 0 for gr in grads)
    grads = torch.autograd.grad(kl_gf, [f, g])
    assert all(gr is not None and gr.abs().sum() > 0 for gr in grads)


def test_lambda_mix_eqs_9_10():
    # 0.25 * 2 + 0.75 * 4 = 0.5 + 3.0 = 3.5
    assert lambda_mix(2.0, 4.0, 0.25) == pytest.approx(3.5)
    assert lambda_mix(2.0, 4.0, 1.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        lambda_mix(2.0, 4.0, 1.5)
