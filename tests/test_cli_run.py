"The CLI's main jobs end to end with tiny budgets: demo on the shipped teacher, convert on a local teacher directory, report."
import json, subprocess, sys
from pathlib import Path
import pytest, torch

EXE = str(Path(sys.executable).with_name('taylor-calibrate'))

def run(*args):
    r = subprocess.run([EXE, *map(str, args)], capture_output=True, text=True)
    assert 'Traceback' not in r.stderr, r.stderr
    return r

def test_demo_quick(tmp_path):
    out = tmp_path/'demo'
    r = run('demo', '--inits', 'naive,taylor+', '--calib-tokens', '1024', '--steps', '3', '--eval-tokens', '2048', '--out', out)
    assert r.returncode == 0, r.stderr
    ppl = json.loads((out/'perplexity.json').read_text())
    assert set(ppl) == {'teacher', 'naive', 'taylor+'} and all(v > 1 for v in ppl.values())
    assert (out/'model'/'config.json').exists() and (out/'report.html').stat().st_size > 10_000
    r = run('report', out)
    assert r.returncode == 0 and 'taylor+' in r.stdout
    r = run('distill', '--student', out, '--tokens', '1024', '--seq-len', '128', '--batch-size', '1', '--eval-tokens', '512',
            '--grad-accum', '2', '--schedule', 'cosine', '--warmup-tokens', '256', '--dtype', 'float32', '--out', tmp_path/'distilled')
    assert r.returncode == 0, r.stderr
    log = json.loads((tmp_path/'distilled'/'distill_log.json').read_text())
    assert log['tokens_seen'] == [256, 512, 768, 1024] and len(log['eval_ppl']) >= 2
    cfg = log['config']
    assert (cfg['grad_accum'], cfg['tokens_per_step'], cfg['schedule'], cfg['warmup_steps']) == (2, 256, 'cosine', 1)
    assert log['lr'][0] == 0.0 and log['lr'][1] == 1e-4 and log['lr'][1] > log['lr'][2] > log['lr'][3] > 0   # warm-up, then cosine decay
    r = run('report', out/'model')                       # a hybrid's own folder: its calibration report
    assert r.returncode == 0 and r.stdout.startswith('taylor+:'), r.stderr
    r = run('report', tmp_path/'distilled')              # a distill output: the student's report and the last log rows
    assert r.returncode == 0 and 'distillation (last rows):' in r.stdout, r.stderr

def test_convert_local_teacher_dir(tmp_path):
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import load_hybrid
    teacher, tok = load_teacher()
    teacher.save_pretrained(tmp_path/'teacher'); tok.save_pretrained(tmp_path/'teacher')
    (tmp_path/'text.txt').write_text('\n'.join(f'Line {i} of some calibration text about Python lists and dicts.' for i in range(400)))
    r = run('convert', '--teacher', tmp_path/'teacher', '--keep', '0,4', '--init', 'taylor', '--data', tmp_path/'text.txt',
            '--calib-tokens', '512', '--steps', '2', '--seq-len', '256', '--out', tmp_path/'hybrid')
    assert r.returncode == 0, r.stderr
    hybrid = load_hybrid(tmp_path/'hybrid'/'model')
    assert hybrid.config.taylor_calibrate['converted_layers'] == [1, 2, 3, 5, 6, 7]

def test_convert_bad_input(tmp_path):
    r = run('convert', '--teacher', tmp_path/'missing-dir-but-not-a-hub-name/x/y', '--data', 'train', '--out', tmp_path/'o')
    assert r.returncode != 0 and 'error' in r.stderr
    r = run('convert', '--teacher', tmp_path, '--data', 'train', '--out', tmp_path/'o')
    assert r.returncode == 1 and 'lacks' in r.stderr
    r = run('demo', '--inits', 'magic')
    assert r.returncode == 1 and 'unknown init' in r.stderr

def test_diagnose_naive_scale_on_the_shipped_teacher_and_a_rescaled_copy(tmp_path):
    "diagnose prints one row per converted layer and a verdict; on a teacher saved in another gauge the verdict flips."
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.core import rescale_value_output
    r = run('diagnose', '--keep', 'uniform:0.25', '--heldout-tokens', '1024')
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ['layer', 'context_rms', 'attn_output_rms', 'residual_rms'] and len(lines) == 1 + 6 + 1
    assert lines[-1].startswith('a naive copy is under-scaled by')
    teacher, tok = load_teacher()
    rescale_value_output(teacher, 30.).save_pretrained(tmp_path/'t30'); tok.save_pretrained(tmp_path/'t30')
    r = run('diagnose', '--teacher', tmp_path/'t30', '--keep', '0,4', '--inits', 'naive', '--heldout-tokens', '1024')
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith('a naive copy is over-scaled by'), r.stdout + r.stderr
    r = run('diagnose', '--keep', 'every-other')
    assert r.returncode == 1 and 'every-other' in r.stderr

def test_distill_two_processes_under_accelerate_launch(tmp_path):
    "accelerate launch, 2 CPU processes (gloo), 1 window x 2 micro-batches each: one output folder, a 2-process checkpoint, steps of 512 tokens."
    import os
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid, save_hybrid
    teacher, tok = load_teacher()
    save_hybrid(to_hybrid(teacher, [0, 4]), tmp_path/'hybrid', tok)
    cmd = [str(Path(sys.executable).with_name('accelerate')), 'launch', '--multi_gpu', '--num_processes', '2', '--num_machines', '1',
           '--mixed_precision', 'no', '--dynamo_backend', 'no', '--no_python', EXE, 'distill', '--student', tmp_path/'hybrid',
           '--tokens', '1024', '--seq-len', '128', '--batch-size', '1', '--grad-accum', '2', '--eval-tokens', '256',
           '--checkpoint-dir', tmp_path/'ck', '--out', tmp_path/'out']
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, ACCELERATE_USE_CPU='true', OMP_NUM_THREADS='1'))
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert r.stdout.count('wrote ') == 1   # the main process writes, once
    log = json.loads((tmp_path/'out'/'distill_log.json').read_text())
    assert log['tokens_seen'] == [512, 1024] and (log['config']['num_processes'], log['config']['grad_accum']) == (2, 2)
    assert sorted(p.name for p in (tmp_path/'ck'/'ckpt').glob('random_states_*.pkl')) == ['random_states_0.pkl', 'random_states_1.pkl']
