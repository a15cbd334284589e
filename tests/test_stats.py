"Streamed attention statistics: analytic cases, chunking invariance, bf16 teachers and the shipped teacher vs full-matrix eager."
import math
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from taylor_calibrate.stats import attention_stats, attn_implementation, distance_bucket_edges

torch.set_num_threads(1)

def tiny_qwen2(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2)
    return Qwen2ForCausalLM(Qwen2Config(**{**cfg, **kw})).eval()

def test_uniform_attention_is_exact():
    "Zero queries give uniform causal attention: distance mean_t t/2, relative entropy 1, bucket masses by counting."
    m = tiny_qwen2()
    with torch.no_grad():
        for a in (l.self_attn for l in m.model.layers): a.q_proj.weight.zero_(); a.q_proj.bias.zero_()
    T = 300
    st = attention_stats(m, torch.randint(0, 97, (2, T)), chunk_size=64, progress=False)
    t = torch.arange(T, dtype=torch.float64)
    edges = distance_bucket_edges(T)
    hist = torch.zeros(len(edges) - 1, dtype=torch.float64)
    for ti in range(T):
        d = ti - torch.arange(ti + 1)
        hist += torch.bincount(torch.bucketize(d, edges, right=True) - 1, minlength=len(hist)).double() / (ti + 1)
    for l in st.layers:
        torch.testing.assert_close(st.mean_distance[l], torch.full((4,), float((t / 2).mean())), rtol=1e-5, atol=0)
        torch.testing.assert_close(st.entropy[l], torch.full((4,), float(torch.log(t + 1).mean())), rtol=1e-5, atol=0)
        torch.testing.assert_close(st.rel_entropy[l], torch.ones(4), rtol=1e-5, atol=0)
        torch.testing.assert_close(st.distance_hist[l], (hist / T).float().expand(4, -1), rtol=1e-5, atol=1e-7)

def test_chunk_and_batch_size_do_not_change_results():
    m = tiny_qwen2(1)
    seqs = [torch.randint(0, 97, (n,)) for n in (40, 33, 7, 21)]
    a = attention_stats(m, seqs, chunk_size=1, batch_size=1, progress=False)
    b = attention_stats(m, seqs, chunk_size=1000, batch_size=4, progress=False)
    for f in ('mean_distance', 'entropy', 'rel_entropy', 'distance_hist'):
        for l in a.layers: torch.testing.assert_close(getattr(a, f)[l], getattr(b, f)[l], rtol=1e-5, atol=1e-7)
    assert a.n_tokens == b.n_tokens == 101

def test_bf16_teacher_and_restore():
    m = tiny_qwen2(2).to(torch.bfloat16)
    ids = torch.randint(0, 97, (2, 50))
    st = attention_stats(m, ids, capture=[1], capture_dtype=torch.bfloat16, progress=False)
    assert m.config._attn_implementation == 'sdpa'
    assert all(torch.isfinite(st.mean_distance[l]).all() and (st.rel_entropy[l] <= 1 + 1e-3).all() for l in st.layers)
    assert st.captures[1]['context'].dtype == torch.bfloat16 and st.captures[1]['context'].shape == (2, 50, 4, 8)

def test_shipped_teacher_matches_eager():
    try:
        from taylor_calibrate.teacher import load_teacher
        model, _ = load_teacher()
    except Exception as e: pytest.skip(f"shipped teacher not loadable: {e}")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 128), generator=g)
    st = attention_stats(model, ids, chunk_size=48, progress=False)
    with attn_implementation(model, 'eager'), torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions
    T = ids.shape[1]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).double()
    for l, p in enumerate(att):
        p = p.double()
        ent = -torch.special.xlogy(p, p).sum(-1)
        ref_d, ref_e = (p * dist).sum(-1).mean((0, 2)), ent.mean((0, 2))
        ref_r = (ent[:, :, 1:] / torch.log(torch.arange(2, T + 1).double())).mean((0, 2))
        for ours, ref in ((st.mean_distance[l], ref_d), (st.entropy[l], ref_e), (st.rel_entropy[l], ref_r)):
            assert ((ours.double() - ref).abs() <= 1e-4 * ref.abs()).all(), (l, ours, ref)
