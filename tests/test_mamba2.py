"Checks of taylor_calibrate.mamba2 beyond the notebook's: float64 exactness, one token, padding, gradients through a padded chunk."
import torch, torch.nn.functional as F
from taylor_calibrate.mamba2 import mamba2_recurrence_ref, chunk_mamba2_torch, Mamba2Layer

def inputs(b=2, T=37, H=4, P=5, G=2, N=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    return r(b, T, H, P), F.softplus(r(b, T, H)), -torch.rand(H, generator=g, dtype=dtype) * 3, r(b, T, G, N), r(b, T, G, N), r(H)

def test_float64_chunks_equal_the_recurrence_to_rounding():
    x = inputs()
    torch.testing.assert_close(chunk_mamba2_torch(*x, chunk_size=8)[0], mamba2_recurrence_ref(*x)[0], rtol=1e-10, atol=1e-10)

def test_one_token_and_a_chunk_longer_than_the_sequence():
    for T, c in ((1, 64), (5, 64)):
        x = inputs(T=T)
        torch.testing.assert_close(chunk_mamba2_torch(*x, chunk_size=c)[0], mamba2_recurrence_ref(*x)[0])

def test_gradients_through_a_padded_chunk_match_the_recurrence():
    x = [t.requires_grad_() for t in inputs(T=21)]
    y = [t.detach().clone().requires_grad_() for t in x]
    chunk_mamba2_torch(*x, chunk_size=8)[0].square().sum().backward()
    mamba2_recurrence_ref(*y)[0].square().sum().backward()
    for a, b in zip(x, y): torch.testing.assert_close(a.grad, b.grad)

def test_left_padding_leaves_the_real_tokens_as_without_it():
    "A padded prefix neither decays nor writes the state, and the convolution sees zeros there, as at a sequence's start."
    torch.manual_seed(0)
    layer = Mamba2Layer(16, num_heads=2, head_dim=8, state_size=4, n_groups=1, chunk_size=8)
    h = torch.randn(1, 12, 16)
    padded = torch.cat([torch.randn(1, 5, 16), h], 1)
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 12)], 1).long()
    with torch.no_grad():
        torch.testing.assert_close(layer(padded, attention_mask=mask)[0][:, 5:], layer(h)[0], rtol=1e-5, atol=1e-5)
