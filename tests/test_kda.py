"Checks of taylor_calibrate.kda beyond the notebook's: one token, sequences independent within a batch, gradients through a padded chunk."
import torch, torch.nn.functional as F
from taylor_calibrate.kda import kda_recurrence_ref, chunk_kda_torch, kda_rule

def inputs(B=2, T=37, H=2, K=8, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    return q, k, torch.randn(B, T, H, V, generator=g, dtype=torch.float64), -F.softplus(torch.randn(B, T, H, K, generator=g, dtype=torch.float64)), \
        torch.rand(B, T, H, generator=g, dtype=torch.float64)

def test_one_token():
    x = inputs(T=1)
    torch.testing.assert_close(chunk_kda_torch(*x)[0], kda_recurrence_ref(*x)[0])

def test_sequences_of_a_batch_are_independent():
    x = inputs(B=3)
    whole = chunk_kda_torch(*x, chunk_size=16)[0]
    for b in range(3):
        torch.testing.assert_close(chunk_kda_torch(*(t[b:b + 1] for t in x), chunk_size=16)[0], whole[b:b + 1])

def test_state_carries_across_calls():
    "Two calls, the second starting from the first's final state, equal one call over the whole sequence."
    x = inputs(T=40)
    o1, S1 = chunk_kda_torch(*(t[:, :25] for t in x), output_final_state=True, chunk_size=16)
    o2, _ = chunk_kda_torch(*(t[:, 25:] for t in x), initial_state=S1, chunk_size=16)
    torch.testing.assert_close(torch.cat([o1, o2], 1), kda_recurrence_ref(*x)[0])

def test_gradients_through_a_padded_chunk_are_finite_and_match():
    x = [t.requires_grad_() for t in inputs(T=21)]
    y = [t.detach().clone().requires_grad_() for t in x]
    ga = torch.autograd.grad(chunk_kda_torch(*x, chunk_size=16)[0].sum(), x)
    gb = torch.autograd.grad(kda_recurrence_ref(*y)[0].sum(), y)
    for a, b in zip(ga, gb):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)

def test_kda_rule_on_a_cpu_is_ours():
    x = inputs()
    torch.testing.assert_close(kda_rule(*x)[0], chunk_kda_torch(*x)[0], rtol=0, atol=0)
