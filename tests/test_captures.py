"""Captures collected in segments resumed from the stored residual stream equal passes from the embeddings, to the bit.

The reference is a pass from the embeddings per capture group, `attention_stats(teacher, ids, layers=group, capture=group)`;
`calibrate` runs one pass over each window set, a group's segment at a time (`windows.layer_captures`). Statistics,
captures and capture masks must be equal (`torch.equal`), and so must the calibrated state dicts of `calibrate` with the
default capture budget and with one layer per group.
"""
import gc, itertools, weakref
import pytest, torch
import taylor_calibrate.core as core
import taylor_calibrate.windows as windows
from taylor_calibrate.stats import ResidualStream, attention_stats
from test_convert import tiny

torch.set_num_threads(1)
STAT_FIELDS = ('mean_distance', 'entropy', 'rel_entropy', 'distance_hist')

def assert_same(got, want, layers):
    "Bit-identical statistics, captures and capture masks of `layers`."
    for l in layers:
        for f in STAT_FIELDS: assert torch.equal(getattr(got, f)[l], getattr(want, f)[l]), (f, l)
        for k, v in want.captures[l].items(): assert torch.equal(got.captures[l][k], v), (l, k)
    assert torch.equal(got.capture_mask, want.capture_mask)

def one_layer_per_group(monkeypatch):
    monkeypatch.setattr(windows, 'CAPTURE_FLOOR', 1); monkeypatch.setattr(windows, 'CAPTURE_BUDGET', 0.)

def padded(vocab, lengths, seed=0):
    "Sequences of different lengths: batches of 2 then hold padding and are cut to their own longest sequence."
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]

def segments_vs_passes(model, seqs, groups, **kw):
    "Each group from a segment resumed from the previous one, against a pass from the embeddings."
    stream = None
    for i, group in enumerate(groups):
        seg = attention_stats(model, seqs, layers=group, capture=group, resume=stream, keep_residual=i + 1 < len(groups), **kw)
        assert_same(seg, attention_stats(model, seqs, layers=group, capture=group, **kw), group)
        stream = seg.residual
        if i + 1 < len(groups): assert stream.layer == group[-1] + 1
    assert stream is None

@pytest.mark.parametrize('kind,kw', [('llama', {}), ('mistral', dict(sliding_window=8)), ('qwen3', {}),
                                     ('qwen2', dict(use_sliding_window=True, sliding_window=8, max_window_layers=2)),
                                     ('qwen2_moe', {}), ('qwen3_moe', {})], ids=['llama', 'mistral-window8', 'qwen3',
                                     'qwen2-window8-layers2,3', 'qwen2_moe', 'qwen3_moe'])
def test_random_families_segments_equal_passes(kind, kw):
    """Llama (llama3 RoPE), Mistral with a window shorter than the sequences, Qwen2 with full and sliding layers, Qwen3, MoE.
    Qwen2 picks a layer's mask by its place in the layer list, so a list cut down to the segment would give its sliding
    layers the full mask: the list keeps its length, with the layers before the segment passing their input on."""
    model = tiny(kind, **kw)
    seqs = padded(96, (40, 29, 13, 33, 21))
    if kw.get('max_window_layers'): assert model.config.layer_types == ['full_attention'] * 2 + ['sliding_attention'] * 2
    for groups in ([[0], [1], [2], [3]], [[1], [2, 3]], [[0, 2], [3]]):
        segments_vs_passes(model, seqs, groups, chunk_size=7, batch_size=2, progress=False)

def test_bf16_teacher_keeps_a_bf16_stream():
    model = tiny('qwen2').to(torch.bfloat16)
    seqs = padded(96, (30, 17, 25))
    st = attention_stats(model, seqs, layers=[0], capture=[0], keep_residual=True, batch_size=2, progress=False)
    assert isinstance(st.residual, ResidualStream) and st.residual.hidden.dtype == torch.bfloat16
    assert st.residual.layer == 1 and st.residual.hidden.shape == (3, 30, 64) and st.residual.hidden.device.type == 'cpu'
    segments_vs_passes(model, seqs, [[0], [1], [3]], batch_size=2, progress=False)

def test_resume_checks_its_input():
    model = tiny('llama')
    seqs = padded(96, (20, 12))
    st = attention_stats(model, seqs, layers=[1], keep_residual=True, progress=False)
    with pytest.raises(ValueError, match='come before layer 2'): attention_stats(model, seqs, layers=[1, 2], resume=st.residual, progress=False)
    with pytest.raises(ValueError, match='sequences x tokens'): attention_stats(model, seqs[:1], layers=[2], resume=st.residual, progress=False)

@pytest.fixture(scope='module', params=['tiny-qwen2', 'tiny-qwen3'])
def shipped(request):
    from taylor_calibrate.teacher import load_teacher
    return request.param, *load_teacher(request.param)

def test_shipped_layer_captures_equal_per_group_passes(shipped, monkeypatch):
    "What `calibrate` reads for each layer (statistics, captures on calibration and held-out windows) equals passes from the embeddings."
    name, teacher, tok = shipped
    one_layer_per_group(monkeypatch)
    ids = core.token_windows('train', tok, 256, max_tokens=7 * 256)
    cal, held = ids[:5], ids[5:7]
    n = teacher.config.num_hidden_layers
    conv = [l for l in range(n) if l != n // 2]                   # a kept attention layer between two converted ones
    groups = windows.capture_groups(teacher, conv, cal.numel() + held.numel())
    assert groups == [[l] for l in conv]
    calls = []
    def counted(*a, **kw):
        calls.append((kw['resume'].layer if kw.get('resume') is not None else 0, kw.get('keep_residual', False)))
        return attention_stats(*a, **kw)
    monkeypatch.setattr(windows, 'attention_stats', counted)
    timings = dict(statistics_s=0.)
    captures = windows.layer_captures(teacher, cal, held, conv, timings, False)
    first = next(captures)
    stream = weakref.ref(first[1].residual.hidden)                # the calibration windows' stream, shared by all segments
    assert first[1].residual.hidden.dtype == torch.float32 and first[1].residual.hidden.shape == (5, 256, teacher.config.hidden_size)
    whole = attention_stats(teacher, cal, layers=conv, progress=False)   # one pass from the embeddings measuring every layer
    seen = []
    for l, st, (cap, cmask), (hcap, hmask) in itertools.chain([first], captures):
        ref = attention_stats(teacher, cal, layers=[l], capture=[l], progress=False)
        href = attention_stats(teacher, held, layers=[], capture=[l], progress=False)
        for f in STAT_FIELDS:
            assert torch.equal(getattr(st, f)[l], getattr(ref, f)[l]) and torch.equal(getattr(st, f)[l], getattr(whole, f)[l]), (name, l, f)
        for k in ('input', 'context', 'output'):
            assert torch.equal(cap[k], ref.captures[l][k]) and torch.equal(hcap[k], href.captures[l][k]), (name, l, k)
        assert torch.equal(cmask, ref.capture_mask) and torch.equal(hmask, href.capture_mask)
        seen.append(l)
    assert seen == conv and timings['statistics_s'] > 0
    # one pass per window set: every segment after the first resumes where the previous one stopped, the last keeps nothing
    starts = [0] + [g[-1] + 1 for g in groups[:-1]]
    assert calls[:2] == [(0, True), (0, True)] and calls[::2] == [(s, g != groups[-1]) for s, g in zip(starts, groups)]
    assert calls[1::2] == calls[::2]
    del first, st, cap, hcap
    gc.collect()
    assert stream() is None, 'the stored residual stream outlives the last group'

@pytest.mark.parametrize('init', ['taylor', 'taylor+'])
def test_calibrate_is_the_same_with_one_layer_per_group(shipped, init, monkeypatch):
    "Captures are equal, so the calibrated hybrid is too: the default capture budget (several layers per group) vs one layer per group."
    name, teacher, tok = shipped
    run = lambda: core.calibrate(teacher, 'train', init=init, tokenizer=tok, steps=4, progress=False)
    default = run()
    rep = default.calibration_report
    groups = lambda: windows.capture_groups(teacher, rep.converted, rep.data['calib_tokens'] + rep.data['heldout_tokens'])
    assert len(groups()) < len(rep.converted)
    one_layer_per_group(monkeypatch)
    assert groups() == [[l] for l in rep.converted]
    per_layer = run()
    a, b = default.state_dict(), per_layer.state_dict()
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f'{name} {init}: {differ[:5]}'
