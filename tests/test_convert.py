"Integration tests of hybrid conversion (taylor_calibrate.convert): families, GQA copy, generation, save/load, layer policies."
import json
import pytest, torch
import torch.nn.functional as F
from transformers import (DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
import taylor_calibrate.convert as convert, taylor_calibrate.policies as policies
from taylor_calibrate.cache import cache_bytes, measured_cache_bytes
from taylor_calibrate.hybrid import load_hybrid, save_hybrid
from taylor_calibrate.convert import attention_geometry, check_teacher, converted_layers, gdn_modules, to_hybrid
from taylor_calibrate.policies import select_layers

torch.set_num_threads(1)
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)
FAMILIES = {
    'qwen2': lambda **kw: Qwen2ForCausalLM(Qwen2Config(**COMMON, **kw)),
    'llama': lambda **kw: LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=dict(
        rope_type='llama3', rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64), **kw)),
    'qwen3': lambda **kw: Qwen3ForCausalLM(Qwen3Config(**{**COMMON, 'head_dim': 8}, **kw)),
    'mistral': lambda **kw: MistralForCausalLM(MistralConfig(**{**COMMON, 'sliding_window': None, **kw})),
    'qwen2_moe': lambda **kw: Qwen2MoeForCausalLM(Qwen2MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=32, shared_expert_intermediate_size=32, **kw)),
    'qwen3_moe': lambda **kw: Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**COMMON, 'head_dim': 8}, num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=32, **kw)),
}

def cache_kw(model, cache) -> dict:
    "The forward's cache argument: `cache` in transformers 5.24 and later, `past_key_values` in earlier releases."
    import inspect
    return {'cache' if 'cache' in inspect.signature(model.forward).parameters else 'past_key_values': cache}

def enable_checkpointing(model):
    "transformers 5.24's activation_checkpointing_enable, gradient_checkpointing_enable in earlier releases."
    (getattr(model, 'activation_checkpointing_enable', None) or model.gradient_checkpointing_enable)()

def tiny(kind, seed=0, **kw):
    "A tiny random model of `kind` with 8 query / 2 KV heads and non-trivial biases and q/k norm weights."
    torch.manual_seed(seed)
    m = FAMILIES[kind](**kw).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(('q_norm.weight', 'k_norm.weight')): p.uniform_(0.5, 1.5)
            elif n.endswith('_proj.bias'): p.normal_(0, 0.5)
    return m

def snapshot(m): return {k: v.clone() for k, v in {**m.state_dict(), **dict(m.named_buffers())}.items()}

def greedy_by_full_forwards(model, ids, n):
    with torch.no_grad():
        for _ in range(n): ids = torch.cat([ids, model(ids, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    return ids

@pytest.mark.parametrize('kind', list(FAMILIES))
def test_teacher_untouched_and_hybrid_runs(kind, tmp_path):
    teacher = tiny(kind)
    before = snapshot(teacher)
    hybrid = to_hybrid(teacher, [0, 2])
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        assert torch.isfinite(hybrid(ids).logits).all()
        hybrid.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
    hybrid.train(); F.cross_entropy(hybrid(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    assert all(p.grad is not None for g in gdn_modules(hybrid).values() for p in g.parameters())
    save_hybrid(hybrid, tmp_path/'h')
    after = snapshot(teacher)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in teacher.modules())
    assert all(p.grad is None for p in teacher.parameters())
    assert isinstance(hybrid, type(teacher)) and converted_layers(hybrid) == [1, 3]
    assert hybrid.config.model_type == f'taylor_calibrate_{teacher.config.model_type}'

def test_gqa_copy_replicates_whole_kv_heads_and_row_repeat_fails():
    teacher = tiny('qwen2')  # 8 query heads, 2 KV heads: group of 4, with biases
    H, Hkv, d = attention_geometry(teacher.model.layers[1].self_attn)
    assert (H, Hkv, d) == (8, 2, 8)
    def head_blocks_match(hybrid):
        attn, gdn = teacher.model.layers[1].self_attn, gdn_modules(hybrid)[1]
        ok = True
        for j in range(H):
            q, kv = slice(j * d, (j + 1) * d), slice((j // 4) * d, (j // 4 + 1) * d)
            for p in ('k_proj', 'v_proj'):
                ok &= torch.equal(getattr(gdn, p).weight[q], getattr(attn, p).weight[kv])
                ok &= torch.equal(getattr(gdn, p).bias[q], getattr(attn, p).bias[kv])
            ok &= torch.equal(gdn.q_proj.weight[q], attn.q_proj.weight[q]) and torch.equal(gdn.q_proj.bias[q], attn.q_proj.bias[q])
        return ok and torch.equal(gdn.o_proj.weight, attn.o_proj.weight)
    assert head_blocks_match(to_hybrid(teacher, [0]))
    assert not head_blocks_match(to_hybrid(teacher, [0], kv_copy='rows_bug'))

def test_qwen3_norm_fold_exact_with_identity_activation():
    teacher = tiny('qwen3')
    attn = teacher.model.layers[2].self_attn
    gdn = gdn_modules(to_hybrid(teacher, [0], qkv_activation='identity'))[2]
    x = torch.randn(16, 64)
    with torch.no_grad():
        tq = F.normalize(attn.q_norm(attn.q_proj(x).view(16, 8, 8)), dim=-1)
        tk = F.normalize(attn.k_norm(attn.k_proj(x).view(16, 2, 8)), dim=-1).repeat_interleave(4, dim=1)
        gq, gk = (F.normalize(p(x).view(16, 8, 8), dim=-1) for p in (gdn.q_proj, gdn.k_proj))
    assert (gq - tq).abs().max() < 1e-5 and (gk - tk).abs().max() < 1e-5

def test_unsupported_teachers_name_their_type():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"model_type 'gpt2'.*Supported: decoder-only models of model_type llama"):
        to_hybrid(gpt2, [0])
    with pytest.raises(ValueError, match='already a hybrid'):
        check_teacher(to_hybrid(tiny('qwen2'), [0]))

@pytest.mark.parametrize('kind,kw,keep', [('qwen2', {}, [1]), ('qwen3', {}, [0, 3]),
                                          ('mistral', dict(sliding_window=8), [2]), ('llama', {}, [0])])
def test_greedy_generation_equals_full_forward_argmax(kind, kw, keep):
    hybrid = to_hybrid(tiny(kind, **kw), keep)
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(): out = hybrid.generate(prompt, max_new_tokens=32, do_sample=False)
    assert out.shape == (1, 41)
    assert torch.equal(out, greedy_by_full_forwards(hybrid, prompt, 32))

def test_left_padded_batch_and_beam_search():
    hybrid = to_hybrid(tiny('qwen2'), [1])
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(1, 96, (1, 9), generator=g), torch.randint(1, 96, (1, 5), generator=g)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])
    mask = torch.ones_like(batch); mask[1, :4] = 0
    with torch.no_grad():
        out = hybrid.generate(batch, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
        oa, ob = (hybrid.generate(x, max_new_tokens=16, do_sample=False) for x in (a, b))
        beams = [hybrid.generate(a, max_new_tokens=10, num_beams=3, do_sample=False, use_cache=c) for c in (True, False)]
    assert torch.equal(out[0], oa[0]) and torch.equal(out[1, 4:], ob[0])
    assert torch.equal(*beams)

def test_cache_memory_matches_analytic_bf16_short_conv():
    hybrid = to_hybrid(tiny('mistral', sliding_window=16).to(torch.bfloat16), [0], use_short_conv=True)
    cache = DynamicCache(config=hybrid.config)
    with torch.no_grad(): hybrid(torch.randint(0, 96, (3, 40)), **cache_kw(hybrid, cache), use_cache=True)
    assert measured_cache_bytes(cache) == cache_bytes(hybrid.config, 40, batch_size=3, dtype=torch.bfloat16)
    full = cache_bytes(tiny('qwen2').config, 1000)
    assert full['gdn'] == 0 and full['attention'] == 4 * 2 * 2 * 8 * 1000 * 4

def test_load_never_reinitialises_gdn_parameters(tmp_path):
    hybrid = to_hybrid(tiny('qwen3'), [0])
    with torch.no_grad():
        for g in gdn_modules(hybrid).values():
            g.A_log.copy_(torch.linspace(-20, 3, g.num_heads)); g.dt_bias.copy_(torch.linspace(-9, 9, g.num_heads))
    hybrid.save_pretrained(tmp_path/'native')  # plain save_pretrained writes a loadable hybrid as well
    loaded = load_hybrid(tmp_path/'native')
    for i, g in gdn_modules(loaded).items():
        assert torch.equal(g.A_log, gdn_modules(hybrid)[i].A_log) and torch.equal(g.dt_bias, gdn_modules(hybrid)[i].dt_bias)
        assert torch.isfinite(g.A_log).all()
    cfg = json.loads((tmp_path/'native'/'config.json').read_text())
    assert cfg['model_type'] == 'taylor_calibrate_qwen3' and cfg['taylor_calibrate']['converted_layers'] == [1, 2, 3]
    tiny('qwen3').save_pretrained(tmp_path/'plain')
    with pytest.raises(ValueError, match='no taylor_calibrate section'): load_hybrid(tmp_path/'plain')
    with pytest.raises(ValueError, match='not a hybrid'): save_hybrid(tiny('qwen3'), tmp_path/'x')

@pytest.fixture(scope='module')
def shipped():
    from taylor_calibrate.teacher import load_teacher
    return load_teacher()

def test_shipped_teacher_save_load_bit_identical(tmp_path):
    from taylor_calibrate.teacher import load_teacher
    teacher, tok = load_teacher(dtype=torch.bfloat16)  # (not .to(bfloat16), which would also round the RoPE frequencies)
    hybrid = to_hybrid(teacher, 'uniform:0.25')
    assert converted_layers(hybrid) == [1, 2, 3, 5, 6, 7]
    path = save_hybrid(hybrid, tmp_path/'hybrid', tokenizer=tok)
    assert (path/'tokenizer.json').exists() and sorted(p.name for p in tmp_path.iterdir()) == ['hybrid']
    loaded = load_hybrid(path)
    sd, lsd = hybrid.state_dict(), loaded.state_dict()
    assert sd.keys() == lsd.keys()
    assert all(torch.equal(sd[k], lsd[k]) and sd[k].dtype == lsd[k].dtype == torch.bfloat16 for k in sd)
    buf, lbuf = dict(hybrid.named_buffers()), dict(loaded.named_buffers())  # incl. non-persistent ones (RoPE)
    assert buf.keys() == lbuf.keys() and all(torch.equal(buf[k], lbuf[k]) for k in buf)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = tok('The for statement', return_tensors='pt')
    with torch.no_grad():
        assert torch.equal(loaded.generate(**ids, max_new_tokens=8, do_sample=False),
                           hybrid.generate(**ids, max_new_tokens=8, do_sample=False))

def test_policies_on_shipped_teacher_use_validation_split(shipped, monkeypatch):
    teacher, tok = shipped
    splits = []
    real = policies.corpus_token_ids
    monkeypatch.setattr(policies, 'corpus_token_ids', lambda t, split, n=None: splits.append(split) or real(t, split, n))
    before = snapshot(teacher)
    kept, scores = select_layers(teacher, 'ar:0.25', tokenizer=tok, max_tokens=1024, seq_len=256, progress=False)
    assert len(kept) == 2 and sorted(scores) == list(range(8))
    assert all(scores[i] >= scores[j] for i in kept for j in scores if j not in kept)
    calls = []
    kept2, scores2 = select_layers(teacher, 'ga-s2:0.25', tokenizer=tok, max_tokens=1024, seq_len=256, progress=False,
                                   init=lambda h, t: calls.append(converted_layers(h)) or h)
    assert len(calls) == 8 and all(len(c) == 7 for c in calls)
    assert all(scores2[i] <= scores2[j] for i in kept2 for j in scores2 if j not in kept2)
    assert splits == ['valid', 'valid']
    after = snapshot(teacher)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m._forward_hooks for m in teacher.modules())
    print('ar', kept, scores, '\nga-s2', kept2, scores2)
    # a resumed GA-S2: the layers already measured are not probed again, the others give the same perplexities
    saved, calls = [], []
    kept3, scores3 = select_layers(teacher, 'ga-s2:0.25', tokenizer=tok, max_tokens=1024, seq_len=256, progress=False,
                                   init=lambda h, t: calls.append(converted_layers(h)) or h, measured={i: scores2[i] for i in range(5)},
                                   on_score=lambda i, v: saved.append((i, v)))
    assert len(calls) == 3 and [i for i, _ in saved] == [5, 6, 7] and all(v == scores2[i] for i, v in saved)
    assert (kept3, scores3) == (kept2, scores2)

def test_gradient_checkpointing_masks_padding_like_the_forward():
    ids = torch.randint(1, 96, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids); mask[0, :5] = 0  # left padding in row 0
    grads = []
    for ckpt in (False, True):
        hybrid = to_hybrid(tiny('qwen2'), [1]).train()
        if ckpt: enable_checkpointing(hybrid)
        out = hybrid(ids, attention_mask=mask, use_cache=False).logits
        (out[:, 5:] ** 2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in hybrid.named_parameters() if '.gdn.' in n})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5) for n in grads[0])

def test_cache_batch_operations_on_gdn_slots():
    hybrid = to_hybrid(tiny('qwen2'), [0])
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = hybrid(torch.cat([ids, ids[[1]]]), use_cache=False).logits[:, -1]
        cache = DynamicCache(config=hybrid.config)
        hybrid(ids[:, :9], **cache_kw(hybrid, cache), use_cache=True)
        cache.batch_repeat_interleave(2)          # rows 0, 0, 1, 1
        cache.batch_select_indices(torch.tensor([0, 2, 3]))  # rows 0, 1, 1
        step = hybrid(torch.cat([ids, ids[[1]]])[:, 9:], **cache_kw(hybrid, cache), use_cache=True).logits[:, -1]
        assert torch.allclose(step, full, atol=1e-5)
    with pytest.raises(RuntimeError, match='cannot be rolled back'): cache.crop(-1)   # before reset: transformers 5.19 cannot crop a reset cache
    cache.reset()
    assert all(l.state is None for l in cache.layers if isinstance(l, convert.GDNCacheLayer))

def test_static_cache_and_4d_masks_are_refused_clearly():
    hybrid = to_hybrid(tiny('qwen2'), [0])
    ids = torch.randint(0, 96, (1, 5))
    with pytest.raises(ValueError, match='GDN layers need the 2-D attention_mask'):
        hybrid.generate(ids, max_new_tokens=2, do_sample=False, cache_implementation='static')
    with pytest.raises(ValueError, match='got a 4-D tensor'):
        hybrid(ids, attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))

def short_needles(monkeypatch):
    "Two needle prompts of 128 tokens in place of the policy's eight of 1,536: the path, not the map."
    real = policies.needle_prompts
    monkeypatch.setattr(policies, 'needle_prompts', lambda tok, ids: real(tok, ids, n=2, length=128))

def test_the_needle_policy_fits_twice_scores_every_layer_and_resumes(shipped, monkeypatch):
    teacher, tok = shipped
    short_needles(monkeypatch)
    fits = []
    def fit(h, t): fits.append(converted_layers(h)); return h
    kept, scores = select_layers(teacher, 'needle:0.25', tokenizer=tok, progress=False, init=fit)
    assert [len(c) for c in fits] == [7, 1] and fits[1] == [0]              # every layer but 0, then layer 0
    assert sorted(scores) == list(range(8)) and len(kept) == 2 and kept[0] == 0     # the first tenth (1 of 8), then the costliest
    assert all(scores[kept[1]] >= scores[j] for j in range(1, 8))
    saved, fits = [], []
    again = select_layers(teacher, 'needle:0.25', tokenizer=tok, progress=False, init=fit, measured={i: scores[i] for i in range(6)},
                          on_score=lambda i, v: saved.append((i, v)))
    assert [i for i, _ in saved] == [6, 7] and again == (kept, scores)
    fits = []
    assert select_layers(teacher, 'needle:0.5', tokenizer=tok, progress=False, init=fit, measured=scores)[1] == scores and not fits
    with pytest.raises(ValueError, match='tokenizer='): select_layers(teacher, 'needle:0.25', init=fit)

def test_calibrate_fits_the_needle_map_by_phase1(shipped, monkeypatch):
    import taylor_calibrate.core as core
    teacher, tok = shipped
    used = []
    def phase1_fit(data, tokenizer, seq_len, seed, progress):
        used.append((data, seq_len)); return lambda h, t: h
    monkeypatch.setattr(core, '_phase1_fit', phase1_fit); short_needles(monkeypatch)
    h = core.calibrate(teacher, 'train', keep='needle:0.25', init='naive', tokenizer=tok, seq_len=256, progress=False)
    rep = h.calibration_report
    assert used == [('train', 256)] and rep.selection['policy'] == 'needle:0.25' and 0 in rep.keep and len(rep.keep) == 2
    assert sorted(rep.selection['scores']) == list(range(8))
