"Integration checks for taylor_calibrate.taylor beyond the notebook's examples (shapes, dtypes, edge cases)."
import math
import pytest
import torch
import plotly.graph_objects as go
from taylor_calibrate.taylor import (attention_probs, softmax_attention, taylor_attention, taylor_attention_quadratic,
    taylor_error_by_head, random_qkv, relative_error, plot_error_vs_logit_scale, plot_error_vs_entropy, ols_scale,
    softplus_inv)
from taylor_calibrate.core import b_dt, half_life, concentration_minmax, concentration_relative, beta_star, alpha_star

torch.set_num_threads(1)


@pytest.mark.parametrize('order', [1, 2])
@pytest.mark.parametrize('causal', [True, False])
def test_recurrent_equals_quadratic_with_value_dim_and_batch(order, causal):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 3, 12, 5, generator=g, dtype=torch.float64).unbind(0)
    v = torch.randn(2, 3, 12, 7, generator=g, dtype=torch.float64)          # d_v != d
    out = taylor_attention(q, k, v, order, causal)
    assert out.shape == (2, 3, 12, 7)
    torch.testing.assert_close(out, taylor_attention_quadratic(q, k, v, order, causal), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('order', [1, 2])
def test_non_causal_allows_different_query_and_key_lengths(order):
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(4, 5, generator=g, dtype=torch.float64), torch.randn(9, 5, generator=g, dtype=torch.float64), \
        torch.randn(9, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(taylor_attention(q, k, v, order, causal=False),
                               taylor_attention_quadratic(q, k, v, order, causal=False))
    with pytest.raises(ValueError, match='as many queries as keys'):
        taylor_attention(q, k, v, order, causal=True)


def test_error_shrinks_with_logit_scale_and_order_two_wins():
    errs = {o: [taylor_error_by_head(*random_qkv(4, 32, 8, s, seed=3), order=o)[1].mean().item() for s in (0.3, 0.1, 0.03)]
            for o in (1, 2)}
    for o in (1, 2): assert errs[o][0] > errs[o][1] > errs[o][2]
    assert all(e2 < e1 for e1, e2 in zip(errs[1], errs[2]))


def test_error_by_head_bfloat16_and_batch_averaging():
    q, k, v = random_qkv(3, 16, 8, 0.5, seed=4)
    ent, err = taylor_error_by_head(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert ent.dtype == torch.float32 and err.shape == (3,) and torch.isfinite(err).all()
    # two copies of the same batch element give the same per-head numbers as one
    ent1, err1 = taylor_error_by_head(q, k, v)
    ent2, err2 = taylor_error_by_head(*(torch.stack([t, t]) for t in (q, k, v)))
    torch.testing.assert_close(ent2, ent1); torch.testing.assert_close(err2, err1)
    with pytest.raises(ValueError, match=r'\[H, T, d\]'):
        taylor_error_by_head(q[0], k[0], v[0])


def test_softmax_attention_rows_and_causality():
    q, k, v = random_qkv(2, 10, 4, 2.0, seed=5)
    p = attention_probs(q, k)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 10, dtype=torch.float64))
    assert (p.triu(1) == 0).all()
    # changing a future value does not change earlier outputs
    v2 = v.clone(); v2[:, -1] += 10
    torch.testing.assert_close(softmax_attention(q, k, v2)[:, :-1], softmax_attention(q, k, v)[:, :-1])


def test_figures_are_plotly_figures():
    fig = plot_error_vs_logit_scale([0.3, 0.01, 0.1], n_heads=2, T=8, d=4)
    assert isinstance(fig, go.Figure) and len(fig.data) == 4
    assert list(fig.data[0].x) == sorted(fig.data[0].x)
    fig = plot_error_vs_entropy(*random_qkv(3, 8, 4, [0.1, 1., 3.]))
    assert isinstance(fig, go.Figure) and [t.name for t in fig.data] == ['order 1', 'order 2']


def test_mappings_compose():
    d = torch.logspace(-0.2, 2.5, 20, dtype=torch.float64)        # 0.63 .. 316 tokens: inside the clamp
    torch.testing.assert_close(half_life(b_dt(d)), d)
    torch.testing.assert_close(softplus_inv(torch.nn.functional.softplus(torch.tensor(-80., dtype=torch.float64))),
                               torch.tensor(-80., dtype=torch.float64))
    beta = beta_star(concentration_minmax(torch.rand(4, 6, generator=torch.Generator().manual_seed(6)) * 3))
    assert beta.min() >= 0.3 - 1e-6 and beta.max() <= 0.7 + 1e-6
    assert not torch.isnan(concentration_minmax(torch.full((2, 3), 1.7))).any()
    torch.testing.assert_close(concentration_relative(torch.tensor([0.2])), torch.tensor([0.8]))
    torch.testing.assert_close(alpha_star(torch.tensor(0.02), torch.tensor(0.04)), torch.tensor(0.005))
    with pytest.raises(ValueError): b_dt(-1.)
    with pytest.raises(ValueError): softplus_inv(torch.tensor([1., -1.]))


def test_ols_scale_is_the_least_squares_minimiser():
    g = torch.Generator().manual_seed(7)
    pred, target = torch.randn(3, 20, 2, 4, generator=g), torch.randn(3, 20, 2, 4, generator=g)
    s = ols_scale(target, pred)
    loss = lambda s: ((target - s[:, None] * pred) ** 2).sum((0, 1, 3))
    for eps in (1e-2, -1e-2):
        assert (loss(s + eps) > loss(s)).all()
