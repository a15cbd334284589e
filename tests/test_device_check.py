"The prepared GPU check (bench/device_check.py) and the teacher script's head probe, exercised on the CPU."
import json, subprocess, sys
import torch
from taylor_calibrate.teacher import load_teacher, corpus_token_ids
from taylor_calibrate.stats import attention_stats
import train_teacher


def test_head_probe_matches_attention_stats():
    model, tok = load_teacher()
    ids = corpus_token_ids(tok, 'valid', max_tokens=4 * 128)[:4 * 128]
    impl = model.config._attn_implementation
    probe = train_teacher.head_probe(model, ids, 128)
    assert model.config._attn_implementation == impl   # the probe switches to eager attention and back
    df = attention_stats(model, ids.view(4, 128), progress=False).to_frame()
    lo, hi = df.loc[df.mean_distance.idxmin()], df.loc[df.mean_distance.idxmax()]
    assert abs(probe['min_mean_distance'] - lo.mean_distance) < 1e-3 * lo.mean_distance + 2e-3
    assert abs(probe['max_mean_distance'] - hi.mean_distance) < 1e-3 * hi.mean_distance + 2e-3
    assert probe['min_head'] == [int(lo['layer']), int(lo['head'])] and probe['max_head'] == [int(hi['layer']), int(hi['head'])]
    assert probe['repeat_loss_second'] > 0 and probe['repeat_loss_first'] > 0


def test_device_check_quick(root, tmp_path):
    r = subprocess.run([sys.executable, str(root / 'bench' / 'device_check.py'), '--quick', '--out', str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / 'device_check.json').read_text())
    assert res['meta']['fla_kernels'] is False and res['meta']['total_s'] > 0
    for a in res['layer_agreement']:   # on the CPU both sides are our kernel; prefill + recurrent steps vs one chunked pass is a real check
        assert a['worst'] < 1e-5, a
    row = res['kernel_timing'][0]
    assert row['kernel'] == 'ours_torch' and row['fwd_s'] > 0 and row['fwd_bwd_s'] > 0   # timings only: this machine is shared
    t = res['teacher_tokens']
    assert t['tokens'] == t['steps'] * t['batch_size'] * 64 and len(t['heads']) >= 1
    assert (tmp_path / 'teacher_gpu' / 'model.safetensors').exists()
    for r in res['full_size']:                # the full-size part, at shrunken shapes on the CPU
        assert 'error' not in r, r.get('error')
        assert r['teacher_unchanged'] and r['stages']['calibrate']['seconds'] > 0 and r['timings']['phase2_s'] > 0
    assert [r.get('generate_matches_in_memory') for r in res['full_size']] == [True, None]   # taylor+ saves, loads, generates
    f = res['fsdp']                           # on the CPU one plain process: the resumed run must equal the straight one
    assert 'error' not in f['straight'] and 'error' not in f['resumed'], f
    assert len(f['straight']['train_kl']) == len(f['resumed']['train_kl']) == 8 and len(f['first_half']['train_kl']) == 4
    assert f['max_abs_kl_diff'] == 0.0
    assert sorted(p.name for p in tmp_path.rglob('*') if p.is_file()).__len__() <= 8   # the device tool brings back at most 8 files
